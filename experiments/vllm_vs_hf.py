"""GRPO with vLLM generating the rollouts (in-process engine, and the OpenAI-compatible server)
against the HF sampler: same SFT'd model, same prompts and seeds, over several seeds. Run in the
vLLM venv (`make test-vllm` builds it):

    PYTHONPATH=src:. .venv-vllm/bin/python experiments/vllm_vs_hf.py runs/vllm_vs_hf \\
        [--seeds 0 1 2] [--steps 16] [--samplers hf,vllm,vllm_server] [--out results/vllm_vs_hf.md]

The recipe is recipes/vllm/cpu.yaml: the shipped tiny base, its SFT once (shared by every run),
then per (seed, sampler) the GRPO stage with `train.seed` = seed and then a greedy eval of the
result with the HF sampler (so the accuracies compare the trained models, not the eval backends).
A sampler does not decide the samples' *distribution* (all three sample the same policy at the
same temperature), only which draws come out: the per-step mean rewards of the runs differ by
sampling noise, and by the divergence that different draws cause over the steps. The table gives,
per sampler, the mean reward over steps (mean ± std over seeds), its paired difference from the
HF sampler's (same seed) with a 95% t-interval, the largest trainer-vs-sampler logprob gap
(`mismatch/max_abs`) and the eval's greedy accuracy; a run folder that has finished is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from experiments.tables import paired, spread, table  # noqa: E402

import temper  # noqa: E402

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "vllm"


def recipe(sampler: str, seed: int, steps: int, stages: int) -> dict:
    """recipes/vllm/cpu.yaml (server_cpu.yaml for vllm_server) with the GRPO stage's sampler and
    seed set, its in-run evals off, and the final eval greedy on the test split with HF."""
    name = "server_cpu" if sampler == "vllm_server" else "cpu"
    r = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
    _, sft, rl, ev = r["stages"]
    sft["train"]["eval_every"] = 0
    rl["sampler"] = sampler
    if sampler == "hf":
        rl.pop("vllm_check_sync", None)
    rl["train"] |= {"steps": steps, "prompts_per_step": 16, "eval_every": 0, "seed": seed}
    ev |= {"sampler": "hf", "n_problems": 200, "k": 1, "models": ["rl"], "splits": ["test"]}
    r["stages"] = r["stages"][:stages]
    return r


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_one(root: Path, sampler: str, seed: int, steps: int) -> Path:
    shared = root / "sft"
    if not (shared / "02-sft" / "stage.json").exists():
        temper.run(recipe("hf", 0, steps, 2), output_dir=shared, base_dir=RECIPES)
    out = root / f"seed-{seed}" / sampler
    if not (out / "04-eval" / "stage.json").exists():
        if not out.exists():
            shutil.copytree(shared, out)
            (out / "recipe.yaml").unlink()  # the folder is this run's from here on
        temper.run(recipe(sampler, seed, steps, 4), output_dir=out, base_dir=RECIPES)
    return out


def summarize(root: Path, seeds: list[int], samplers: list[str]) -> str:
    reward: dict[str, list[float]] = {s: [] for s in samplers}
    accuracy: dict[str, list[float]] = {s: [] for s in samplers}
    mismatch: dict[str, list[float]] = {s: [] for s in samplers}
    for sampler in samplers:
        for seed in seeds:
            out = root / f"seed-{seed}" / sampler
            steps = [m for m in rows_of(out / "03-rl" / "metrics.jsonl") if "reward" in m]
            reward[sampler].append(statistics.mean(m["reward"] for m in steps))
            mismatch[sampler].append(max(m.get("mismatch/max_abs", float("nan")) for m in steps))
            evaluated = json.loads((out / "04-eval" / "eval.json").read_text())
            accuracy[sampler].append(
                evaluated["arithmetic"]["rl"]["test"]["metrics"]["greedy_accuracy"]["value"]
            )
    body = []
    for s in samplers:
        diff = "" if s == "hf" else paired(reward["hf"], reward[s], digits=3)
        acc_diff = "" if s == "hf" else paired(accuracy["hf"], accuracy[s], scale=100, digits=1)
        body.append(
            [
                s,
                spread(reward[s], digits=3),
                diff,
                f"{max(mismatch[s]):.2e}",
                spread(accuracy[s], scale=100, digits=1),
                acc_diff,
            ]
        )
    header = [
        "sampler",
        "mean reward over steps",
        "minus HF's (per seed) [95% CI]",
        "max mismatch/max_abs",
        "greedy test accuracy %",
        "minus HF's (points)",
    ]
    return "\n".join(table(header, body))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--samplers", default="hf,vllm,vllm_server")
    parser.add_argument("--out")
    args = parser.parse_args()
    samplers = args.samplers.split(",")
    for seed in args.seeds:
        for sampler in samplers:
            run_one(args.root, sampler, seed, args.steps)
    text = summarize(args.root, args.seeds, samplers)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
