"""AdaptThink per difficulty bucket: greedy accuracy, length and direct-mode share of the start
(two-mode SFT) and the AdaptThink model of each seed, by operator x operand digits, in the
model's own mode choice and with the first token forced to each mode.

Each bucket is the recipe's two_mode arithmetic task narrowed to one operator and one digit count
(`ops: [op], min_digits = max_digits = d`); a problem's train/test split is a hash of the problem
alone, so a bucket's test problems are test problems of the recipe's task. Evaluation is the one
evaluation path (`temper.evaluate.evaluate`, greedy), with `ForcedFirstToken` wrapped around the
sampler for the forced rows. Run after the recipe's seeds (experiments/multiseed.py):

    python experiments/adaptthink_buckets.py recipes/adaptthink.yaml --seeds 0 1 2 \\
        --start two_mode_sft --trained adaptthink --out results/adaptthink_buckets.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tables import spread

from temper.atomic import atomic_write_text
from temper.evaluate import evaluate
from temper.models import load_model, load_tokenizer
from temper.recipe import parse_recipe
from temper.rollout import HFSampler
from temper.runner import stage_dir
from temper.tasks import make_recipe_task
from temper.tasks.two_mode import mode_of
from temper.train.adaptthink import ForcedFirstToken

MODES = {"own": None, "think": 0.0, "direct": 1.0}
"""Row label -> the forced direct share (None: the model's own first token)."""


def buckets(base: dict) -> dict[str, dict]:
    """bucket name -> the two_mode task options of that operator and digit count."""
    inner = dict(base.get("options", {}))
    out = {}
    for op in inner.get("ops", ["+", "-", "*"]):
        for d in range(inner.get("min_digits", 1), inner.get("max_digits", 2) + 1):
            narrowed = inner | {"ops": [op], "min_digits": d, "max_digits": d}
            out[f"{op} {d}-digit"] = base | {"options": narrowed}
    return out


def measure(model_dir: Path, tasks: dict, n: int, max_new_tokens: int) -> dict:
    """bucket -> mode -> {accuracy, length, direct} (greedy, n test problems)."""
    model = load_model(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    plain = HFSampler(model, tokenizer, max_batch_rows=64)
    out: dict = {}
    for bucket, task in tasks.items():
        for mode, share in MODES.items():
            sampler = plain if share is None else ForcedFirstToken(plain, tokenizer, share)
            res = evaluate(
                sampler,
                tokenizer,
                task,
                "test",
                n_problems=n,
                k=0,
                max_new_tokens=max_new_tokens,
                n_examples=n,
            )
            shown = [e["graded"] if "graded" in e else e["completion"] for e in res["examples"]]
            out.setdefault(bucket, {})[mode] = {
                "accuracy": res["metrics"]["greedy_accuracy"]["value"],
                "length": res["metrics"]["mean_length"]["value"],
                "direct": sum(mode_of(c) == "direct" for c in shown) / len(shown),
            }
    return out


def table(per_seed: dict[int, dict[str, dict]], models: list[str]) -> list[str]:
    lines = [
        "| bucket | model | mode | greedy accuracy % | length (tokens) | direct answers % |",
        "|---|---|---|---|---|---|",
    ]
    first = next(iter(per_seed.values()))[models[0]]
    for bucket in first:
        for model in models:
            for mode in MODES:
                cells = [per_seed[s][model][bucket][mode] for s in per_seed]
                lines.append(
                    f"| {bucket} | {model} | {mode} | "
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
    """The buckets' unweighted mean, own mode, per model."""
    lines = ["| model | greedy accuracy % | length (tokens) | direct answers % |", "|---|---|---|---|"]
    for model in models:
        cells = {
            key: [statistics.mean(b["own"][key] for b in per_seed[s][model].values()) for s in per_seed]
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
    parser.add_argument("--start", default="two_mode_sft")
    parser.add_argument("--trained", default="adaptthink")
    parser.add_argument("--task", default="arithmetic_modes")
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out")
    args = parser.parse_args()
    recipe = parse_recipe(Path(args.recipe).read_text())
    tasks = {
        name: make_recipe_task(args.task, opts)
        for name, opts in buckets(dict(recipe.tasks[args.task])).items()
    }
    index = {s.name: i for i, s in enumerate(recipe.stages)}
    models = [args.start, args.trained]
    per_seed: dict[int, dict] = {}
    t0 = time.perf_counter()
    for seed in args.seeds:
        run = recipe.run_dir(Path.cwd()) / f"seed-{seed}"
        per_seed[seed] = {
            m: measure(stage_dir(run, index[m], m) / "model", tasks, args.problems, args.max_new_tokens)
            for m in models
        }
        cache = run / "adaptthink_buckets.json"
        cache.write_text(json.dumps(per_seed[seed], indent=1))
    text = "\n".join(
        [
            f"Per bucket, {args.problems} greedy test problems each, {len(per_seed)} seeds "
            f"(mean ± std [min, max]); mode: own = the model's first token, think / direct = forced.",
            "",
            *table(per_seed, models),
            "",
            "Mean over the buckets, own mode:",
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
