"""Summarize on-policy distillation vs GRPO (recipes/on_policy_distillation.yaml) over seeds: how many
optimizer steps does each arm need to reach the accuracy GRPO reaches?

Target, per seed: GRPO's final sampled training accuracy (the mean of its last `--window` steps:
the quantity RL improves; greedy accuracy barely moves in 100 GRPO steps at this scale, see
results/README.md's GRPO quickstart). Steps to target: the first step at which an arm's trailing
`--window`-step mean of sampled accuracy reaches it (one optimizer step per RL step here), or
"not reached". The OPD and OPSD arms never train on the outcome; it is graded and logged only. Also
the greedy held-out accuracy at the periodic evals and the eval stage's table.

    python experiments/distill.py runs/on_policy_distillation --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlvp import _rows, _stage, spread  # the sibling script (run as a script from any folder)

from temper.atomic import atomic_write_text

ARMS = {"GRPO (outcome)": "grpo", "on-policy distillation": "opd", "on-policy self-distillation": "opsd"}
MODELS = ("teacher", "start", "grpo", "opd", "opsd")


def trailing(values: list[float], window: int) -> list[float]:
    """Mean of the last `window` values at each position (fewer at the start)."""
    return [statistics.mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def steps_to(values: list[float], target: float, window: int) -> int | None:
    """First 1-based step whose trailing mean reaches `target`; None if never."""
    return next((i + 1 for i, v in enumerate(trailing(values, window)) if v >= target - 1e-12), None)


def summarize(root: Path, seeds: list[int], window: int) -> str:
    runs = {s: root / f"seed-{s}" for s in seeds}
    rows = {arm: {s: _rows(run, stage) for s, run in runs.items()} for arm, stage in ARMS.items()}
    targets = {s: statistics.mean(r["accuracy"] for r in rows["GRPO (outcome)"][s][-window:]) for s in seeds}
    lines = [
        f"# On-policy distillation vs GRPO on arithmetic, {len(seeds)} seeds ({', '.join(map(str, seeds))})",
        "",
        f"Target per seed: GRPO's final sampled accuracy (mean of its last {window} steps): "
        + ", ".join(f"seed {s} {100 * t:.1f}%" for s, t in targets.items())
        + f". Steps to target: first step whose trailing {window}-step mean of sampled accuracy reaches it.",
        "",
        "| arm | steps to target (per seed) | sampled accuracy start % | sampled accuracy end % | reverse KL to teacher end (nats/token) |",
        "|---|---|---|---|---|",
    ]
    reached = {}
    for arm, by_seed in rows.items():
        steps = {s: steps_to([r["accuracy"] for r in rs], targets[s], window) for s, rs in by_seed.items()}
        reached[arm] = steps
        start = [statistics.mean(r["accuracy"] for r in rs[:window]) for rs in by_seed.values()]
        end = [statistics.mean(r["accuracy"] for r in rs[-window:]) for rs in by_seed.values()]
        kl = [statistics.mean(r.get("kl_ref", float("nan")) for r in rs[-window:]) for rs in by_seed.values()]
        cells = ", ".join("not reached" if v is None else str(v) for v in steps.values())
        kl_cell = "" if ARMS[arm] == "grpo" else spread(kl, digits=3)
        lines.append(f"| {arm} | {cells} | {spread(start, 100, 1)} | {spread(end, 100, 1)} | {kl_cell} |")
    lines += ["", "Greedy held-out accuracy at the periodic evals (200 test problems), mean over seeds:", ""]
    evals = {
        arm: [[(r["step"], r["eval/arithmetic/accuracy"]) for r in rs if "eval/arithmetic/accuracy" in r] for rs in by_seed.values()]
        for arm, by_seed in rows.items()
    }
    steps = [s for s, _ in next(iter(evals.values()))[0]]
    lines += ["| arm | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|" + "---|" * len(steps)]
    for arm, per_seed in evals.items():
        means = [statistics.mean(seed[i][1] for seed in per_seed) for i in range(len(steps))]
        lines.append(f"| {arm} | " + " | ".join(f"{100 * m:.1f}" for m in means) + " |")
    evals_stage = [json.loads((_stage(run, "eval") / "eval.json").read_text()) for run in runs.values()]
    lines += ["", "Eval stage (300 problems; greedy and mean@4 sampled accuracy):", ""]
    lines += ["| model | split | greedy % | mean@4 % |", "|---|---|---|---|"]
    for model in MODELS:
        for split in ("test", "ood"):
            got = [_eval_cell(e, model, split) for e in evals_stage]
            if any(g is None for g in got):
                continue
            lines.append(
                f"| {model} | {split} | {spread([g[0] for g in got], 100, 1)} | {spread([g[1] for g in got], 100, 1)} |"
            )
    return "\n".join(lines) + "\n"


def _eval_cell(result: dict, model: str, split: str) -> tuple[float, float] | None:
    for key, by_split in result.get("arithmetic", {}).items():
        if key == model or key.endswith(f"-{model}"):
            m = by_split.get(split, {}).get("metrics", {})
            if "greedy_accuracy" in m and "mean@4" in m:
                return m["greedy_accuracy"]["value"], m["mean@4"]["value"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = summarize(args.root, args.seeds, args.window)
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
