"""AdaptThink per difficulty bucket: greedy accuracy, length and direct-mode share of the start
(two-mode SFT) and the AdaptThink model of each seed, by operator x the longer operand's digit
count, in the model's own mode choice and with the first token forced to each mode.

The problems are the recipe task's test split (`--problems` draws with the eval stage's seed
1234), graded through the one evaluation path (`temper.evaluate.evaluate`, greedy, every
completion kept as an example) with `ForcedFirstToken` around the sampler for the forced rows,
then split into buckets by parsing each prompt (`37+5=?` is "+, 2-digit"). Length is completion
tokens including the stop token, as the eval stage's mean_length. Run after the recipe's seeds
(experiments/multiseed.py):

    python experiments/adaptthink_buckets.py recipes/adaptthink.yaml --seeds 0 1 2 \\
        --problems 600 --out results/adaptthink_buckets.md
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from tables import spread

from temper.atomic import atomic_write_text
from temper.catalog import make_recipe_task
from temper.evaluate import evaluate
from temper.models import load_model, load_tokenizer
from temper.recipe import parse_recipe
from temper.rollout import HFSampler
from temper.runner import stage_dir
from temper.tasks.two_mode import mode_of
from temper.train.features.adaptthink import ForcedFirstToken

MODES = {"own": None, "think": 0.0, "direct": 1.0}
"""Row label -> the forced direct share (None: the model's own first token)."""
PROBLEM = re.compile(r"(\d+)([+*-])(\d+)=\?")


def bucket(prompt: str) -> str:
    a, op, b = PROBLEM.fullmatch(prompt).groups()
    return f"{op} {max(len(a), len(b))}-digit"


def measure(model_dir: Path, task, n: int, max_new_tokens: int) -> dict:
    """bucket (and "all") -> mode -> {accuracy, length, direct, n} (greedy, n test problems)."""
    model = load_model(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    plain = HFSampler(model, tokenizer, max_batch_rows=64)
    out: dict = {}
    for mode, share in MODES.items():
        sampler = plain if share is None else ForcedFirstToken(plain, tokenizer, share)
        res = evaluate(
            sampler, tokenizer, task, "test", n_problems=n, k=0, max_new_tokens=max_new_tokens, n_examples=n
        )
        groups: dict[str, list[dict]] = {"all": res["examples"]}
        for e in res["examples"]:
            groups.setdefault(bucket(e["prompt"]), []).append(e)
        for name, examples in groups.items():
            lengths = [
                len(tokenizer.encode(e["completion"], add_special_tokens=False)) + (e["stop_reason"] == "eos")
                for e in examples
            ]
            out.setdefault(name, {})[mode] = {
                "accuracy": sum(e["score"]["correct"] for e in examples) / len(examples),
                "length": sum(lengths) / len(lengths),
                "direct": sum(mode_of(e.get("graded", e["completion"])) == "direct" for e in examples)
                / len(examples),
                "n": len(examples),
            }
        for key, metric in (("accuracy", "greedy_accuracy"), ("length", "mean_length")):
            assert abs(out["all"][mode][key] - res["metrics"][metric]["value"]) < 1e-9, (key, mode)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "all", kv[0])))


def table(per_seed: dict[int, dict[str, dict]], models: list[str]) -> list[str]:
    lines = [
        "| bucket | problems | model | mode | greedy accuracy % | length (tokens) | direct answers % |",
        "|---|---|---|---|---|---|---|",
    ]
    first = next(iter(per_seed.values()))[models[0]]
    for name in first:
        for model in models:
            for mode in MODES:
                cells = [per_seed[s][model][name][mode] for s in per_seed]
                lines.append(
                    f"| {name} | {cells[0]['n']} | {model} | {mode} | "
                    + " | ".join(
                        [
                            spread([c["accuracy"] for c in cells], 100, 1),
                            spread([c["length"] for c in cells], 1, 1),
                            spread([c["direct"] for c in cells], 100, 0),
                        ]
                    )
                    + " |"
                )
    return lines


def overall(per_seed: dict[int, dict[str, dict]], models: list[str]) -> list[str]:
    """All test problems, own mode, per model."""
    lines = ["| model | greedy accuracy % | length (tokens) | direct answers % |", "|---|---|---|---|"]
    for model in models:
        cells = {
            key: [per_seed[s][model]["all"]["own"][key] for s in per_seed]
            for key in ("accuracy", "length", "direct")
        }
        lines.append(
            f"| {model} | {spread(cells['accuracy'], 100, 1)} | {spread(cells['length'], 1, 1)} | "
            f"{spread(cells['direct'], 100, 0)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=["two_mode_sft", "adaptthink", "adaptthink_delta0"])
    parser.add_argument("--task", default="arithmetic_modes")
    parser.add_argument("--problems", type=int, default=600)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out")
    args = parser.parse_args()
    recipe = parse_recipe(Path(args.recipe).read_text())
    task = make_recipe_task(args.task, dict(recipe.tasks[args.task]))
    index = {s.name: i for i, s in enumerate(recipe.stages)}
    models = args.models
    per_seed: dict[int, dict] = {}
    t0 = time.perf_counter()
    for seed in args.seeds:
        run = recipe.run_dir(Path.cwd()) / f"seed-{seed}"
        per_seed[seed] = {
            m: measure(stage_dir(run, index[m], m) / "model", task, args.problems, args.max_new_tokens)
            for m in models
        }
        cache = run / "adaptthink_buckets.json"
        cache.write_text(json.dumps(per_seed[seed], indent=1))
    text = "\n".join(
        [
            f"{args.problems} greedy test problems (seed 1234) by bucket (operator, digits of the longer "
            f"operand), {len(per_seed)} seeds (mean ± std [min, max]); mode: own = the model's first "
            "token, think / direct = the first token forced.",
            "",
            *table(per_seed, models),
            "",
            "All test problems, own mode:",
            "",
            *overall(per_seed, models),
            "",
            f"({time.perf_counter() - t0:.0f} s)",
        ]
    )
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()
