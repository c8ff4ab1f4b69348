"""Every shipped recipe that trains with rl, dpo, kto, reward_model, process_reward_model, rft or
prompt_distill, shrunk to a few steps on the tiny preset, run through `temper run` in float64, and
its training metrics recorded: the pins that a redesign of where the RL and supervised code lives
must reproduce (issue 23: "no behaviour change").

    python tests/pinned_recipes.py --write [NAME ...]   # (re)record tests/pinned/<name>.json
    python tests/pinned_recipes.py --check [NAME ...]   # compare exactly, print every difference

The shrinking is by key name over the whole recipe (budgets, problem counts, token limits), so a
new recipe needs no entry here; the model becomes tests/pinned/start, the tiny base after the quickstart's SFT (pretrain
stages dropped; `start.yaml` rebuilds it), and every RL stage runs 2 steps (the supervised ones 20, so that RL starts from a model
with a format and its groups have rewards that vary).

Why float64: the start is copied in float64 (`float64_copy`), and every stage loads and trains it
so (a float64 checkpoint is never cast down, `temper.models.loading.default_dtype`). In float32
two CPUs round matmuls differently (a first SFT loss ~1.7e-6 apart between the Zen4 the first pins
were recorded on and a Xeon with AMX), 20 training steps amplify that past 1e-4, and in RL one
sampled token that flips changes every step after it: 5 of the 12 recipes of CI failed on the
Xeon. In float64 the matmuls round at ~1e-16; what another CPU still changes comes from the fp32
left inside (see TOLERANCE), ~1e-5 at most after training, and no sampled token flipped.
`tests/test_pinned_recipes.py` compares at TOLERANCE; `--check` is exact, for a change made on
one machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
PINS = Path(__file__).resolve().parent / "pinned"
TRAINING_KINDS = {"rl", "dpo", "kto", "reward_model", "process_reward_model", "rft", "prompt_distill"}

# key -> the largest value kept (budgets and sizes), wherever the key appears
CAPS = {
    "max_steps": 20,  # supervised stages: enough for a format (and so RL rewards that vary)
    "steps": 2,
    "problems_per_task": 24,
    "prompts_per_task": 8,  # preference generators: enough prompts to find a usable pair
    "eval_problems": 4,
    "eval_prompts": 2,
    "n_problems": 4,
    "probe_groups": 1,
    "prompts_per_step": 2,
    "group_size": 4,
    "batch_size": 4,
    "k": 2,
    "max_new_tokens": 24,
    "max_turns": 3,
    "max_episode_tokens": 64,
    "rounds": 1,
    "reference_samples": 2,
    "prompts": 8,
    "max_len": 160,  # packed rows of the recipes' 512 cost more than all the rest
    "train_maps": 8,
    "train_tasks": 6,
    "test_tasks": 2,
    "ood_tasks": 2,
}
ZEROED = {"warmup_steps", "eval_every", "save_every"}
DROPPED = {"cache"}  # a pretrain cache of the full settings would never match the shrunk ones
TIMING = ("time/", "seconds", "async/wait")  # async/wait: how long the trainer waited for a batch
TRAINED = TRAINING_KINDS | {"sft", "pretrain"}
TOLERANCE = {"rel": 1e-4, "abs": 1e-6}
"""What `tests/test_pinned_recipes.py` allows between CPUs. Run with an AVX2 CPU's kernels
(`ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2`) on the AVX-512 Xeon that recorded the
pins, CI's 12 differed by at most ~1.4e-5 relative (on_policy_distillation's last grad_norm): the
fp32 left inside a float64 run (transformers' Llama RMSNorm and rotary embedding compute in fp32,
casting float64 down; the sampler's logprobs are fp32) rounds with the CPU's fp32 kernels, and 20
SFT steps amplify that. On the recording CPU the runs repeat exactly (`--check`)."""
ROUNDING_ONLY = {"mismatch/": 1e-5, "kl_ref_seq": 1e-5}
"""Prefixes of columns that measure only rounding here, and the absolute difference allowed them
with a tolerance: the sampler/trainer mismatch diagnostics compare the sampler's fp32 logprobs
with the trainer's float64 ones (a sequence's largest ~2e-6), which another CPU's fp32 kernels
round differently (AVX2 kernels: up to 4.5e-6 where AVX-512 gave 2.2e-6); so does the KL to the
reference while the policy still is its reference (rlhf_ppo's first PPO step: the sampler's fp32
logprobs against the float64 reference's, summed over a sequence: 2.4e-6 recorded on AVX-512, 5.1e-6
on an AVX2 EPYC). Logprobs kept in float64 by the sampler instead moved four recipes' pins past
the tolerance (the behaviour logprobs enter every ratio), so the sampler stays fp32."""
SIGN_OF = {"rewards/accuracies": "rewards/margins", "accuracy": "margin"}
"""An accuracy (the share of pairs whose margin is > 0) and the margin it is the sign of: where
the row's mean margin is within the tolerance of 0, in the pin and now, the accuracy is the sign
of rounding and is not compared (a DPO stage's first step: the policy is its reference, every
margin is 0 on the recording CPU and 5e-16 with AVX2 kernels, accuracy 0 or 1)."""
ADDED_SINCE_PINNED: tuple[str, ...] = ()
"""Prefixes of metric columns added after the pins were recorded: absent from a pin, they are no
difference; present in one, they compare as every other key. Empty when the pins are written
(last: every column, `mismatch/` included, recorded in float64)."""


def shrink(value: Any, key: str | None = None) -> Any:
    """The recipe with every budget capped (by key name, at any depth)."""
    if isinstance(value, dict):
        return {k: shrink(v, k) for k, v in value.items() if k not in DROPPED}
    if isinstance(value, list):
        return [shrink(v, key) for v in value]
    if key in ZEROED and isinstance(value, int):
        return 0
    if key in CAPS and isinstance(value, int) and not isinstance(value, bool):
        return min(value, CAPS[key])
    if key == "problems_per_task" and isinstance(value, dict):
        return {k: min(v, CAPS[key]) for k, v in value.items()}
    if key == "n" and isinstance(value, list):  # best-of-N's Ns: increasing, each once
        return sorted({min(v, 2) for v in value})
    if key == "min_parse_rate":
        return 0.0
    return value


def shrunk_recipe(path: Path) -> dict[str, Any]:
    recipe = yaml.safe_load(path.read_text())
    out = shrink(copy.deepcopy(recipe))
    # every run starts from tests/pinned/start (see start.yaml): its pretrain stage is dropped and
    # what named it starts from there instead
    model = {k: v for k, v in out["model"].items() if k in ("chat_template", "eos_token")}
    out["model"] = {"path": "../start", **model}
    dropped = {s.get("name", s["kind"]) for s in out["stages"] if s["kind"] == "pretrain"}
    kept = [(i, s) for i, s in enumerate(out["stages"]) if s["kind"] != "pretrain"]
    # a later stage's folder moves up (03-constitutional -> 02-constitutional): so do the paths to it
    folders = {
        f"/{i + 1:02d}-{s.get('name', s['kind'])}/": f"/{j + 1:02d}-{s.get('name', s['kind'])}/"
        for j, (i, s) in enumerate(kept)
    }
    out["stages"] = [_renamed(s, folders) for _, s in kept]
    for stage in out["stages"]:
        if stage.get("source") in dropped:
            del stage["source"]
        if "models" in stage:
            stage["models"] = [m for m in stage["models"] if m not in dropped]
            if not stage["models"]:
                del stage["models"]
        if stage["kind"] in {"sft", "pretrain", "dpo", "kto", "reward_model", "process_reward_model"}:
            stage.setdefault("train", {})["log_every"] = 1
        train = stage.setdefault("train", {}) if stage["kind"] in TRAINED else stage.get("train", {})
        train.pop("precision", None)  # the default, no autocast (float64 stays); auto would measure the CPU
        train["progress"] = False
        if stage["kind"] in TRAINED:
            train["warmup_steps"] = 0  # explicit: the pins do not follow a change of the default
    return out


def _renamed(value: Any, folders: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _renamed(v, folders) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, folders) for v in value]
    if isinstance(value, str):
        for old, new in folders.items():
            value = value.replace(old, new)
    return value


def pinned_recipes() -> list[Path]:
    return [
        p
        for p in sorted(RECIPES.glob("*.yaml"))
        if {s["kind"] for s in yaml.safe_load(p.read_text())["stages"]} & TRAINING_KINDS
    ]


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: v
        for k, v in row.items()
        if isinstance(v, int | float) and not any(t in k for t in TIMING) and not k.endswith("_per_s")
    }


def float64_copy(model: Path, out: Path) -> None:
    """`model` (a saved causal LM and its tokenizer) in float64 at `out`: every stage loads it in
    float64 (`temper.models.loading.default_dtype` keeps a float64 checkpoint) and trains it so."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(model, out)  # the tokenizer and chat template as they are
    AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).save_pretrained(out)


def run_pinned(path: Path, workdir: Path) -> dict[str, list[dict[str, float]]]:
    """Run the shrunk recipe under `workdir` -> {stage folder: its metrics rows (numbers only)}."""
    from temper.cli import main

    (workdir / "recipes").mkdir(parents=True, exist_ok=True)
    links = {"checkpoints": ROOT / "checkpoints", "examples": ROOT / "examples"}
    for name, target in links.items():  # the recipes' ../checkpoints and ../examples
        if not (workdir / name).exists():
            (workdir / name).symlink_to(target)
    if not (workdir / "start").exists():
        float64_copy(PINS / "start", workdir / "start")
    recipe = workdir / "recipes" / path.name
    shrunk = shrunk_recipe(path)
    recipe.write_text(yaml.safe_dump(shrunk, sort_keys=False))
    # a recipe's own output_dir is kept: its stages may name files in it (rlaif's pairs.jsonl)
    run = (recipe.parent / shrunk["output_dir"]).resolve() if "output_dir" in shrunk else workdir / "run"
    if main(["run", str(recipe), "--output-dir", str(run)]) != 0:
        raise RuntimeError(f"{path.name}: the shrunk recipe failed")
    metrics: dict[str, list[dict[str, float]]] = {}
    for stage in sorted(p for p in run.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        for log in sorted(stage.rglob("metrics.jsonl")):
            rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            metrics[str(log.parent.relative_to(run))] = [_numbers(r) for r in rows]
    return metrics


def differences(
    pinned: dict[str, Any], got: dict[str, Any], rel: float = 0.0, abs_: float = 0.0
) -> list[str]:
    """Every value that differs (beyond rel/abs), named by stage folder, row and key; with a
    tolerance, ROUNDING_ONLY and SIGN_OF apply too (exact without one)."""
    out = []
    for stage in sorted(set(pinned) | set(got)):
        a, b = pinned.get(stage), got.get(stage)
        if a is None or b is None or len(a) != len(b):
            out.append(f"{stage}: {len(a or [])} pinned rows, {len(b or [])} now")
            continue
        for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
            for key in sorted(set(ra) | set(rb)):
                x, y = ra.get(key), rb.get(key)
                if x is None and y is not None and key.startswith(ADDED_SINCE_PINNED):
                    continue
                if x is None or y is None:
                    out.append(f"{stage} row {i} {key}: pinned {x}, now {y}")
                    continue
                tol = (
                    max([abs_] + [v for p, v in ROUNDING_ONLY.items() if key.startswith(p)]) if abs_ else 0.0
                )
                margin = SIGN_OF.get(key)
                if abs_ and margin in ra and margin in rb and max(abs(ra[margin]), abs(rb[margin])) <= abs_:
                    continue
                if not ((math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rel, abs_tol=tol)):
                    out.append(f"{stage} row {i} {key}: pinned {x!r}, now {y!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("names", nargs="*", help="recipe stems (default: every pinned recipe)")
    args = p.parse_args(argv)
    paths = [q for q in pinned_recipes() if not args.names or q.stem in args.names]
    PINS.mkdir(exist_ok=True)
    bad = 0
    for path in paths:
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                got = run_pinned(path, Path(tmp))
        except RuntimeError as e:
            print(f"{path.stem}: FAILED {e}", file=sys.stderr)
            bad += 1
            continue
        print(f"{path.stem}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        pin = PINS / f"{path.stem}.json"
        if args.write:
            pin.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
            moved = [s for s, rows in got.items() if any(r.get("grad_norm", 0) > 0 for r in rows)]
            print(
                f"{path.stem}: wrote {sum(map(len, got.values()))} rows; nonzero gradients in {moved}",
                file=sys.stderr,
            )
        if args.check:
            diff = differences(json.loads(pin.read_text()), got)
            bad += bool(diff)
            print(f"{path.stem}: {'OK' if not diff else f'{len(diff)} differences'}", file=sys.stderr)
            for line in diff[:20]:
                print("   ", line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(main())
