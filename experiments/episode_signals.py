"""Episode signals of an environment task's evaluation over seeds: greedy accuracy and chosen
per-episode signal ratios per (task, model, split), mean ± sample std over the seeds' runs.

    python experiments/episode_signals.py runs/memory_corridor --eval 06-eval \\
        --ratio kept=summary_reward/summaries --ratio overflow=context_overflow

`multiseed.py` tables accuracy; what a context budget does to an episode is in the eval's episode
summary (`eval.json`: `episodes.signals`, means per episode over the greedy and sampled episodes):
how many compactions, summaries and prunes, how many summaries kept the fact, how often the budget
ended an episode. A ratio `name=a/b` is the seed's mean of a over its mean of b (kept notes per
note); `name=a` is a's mean per episode. Reads only the run folders.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def seed_rows(run: Path, stage: str) -> list[dict]:
    return [json.loads((d / stage / "eval.json").read_text()) for d in sorted(run.glob("seed-*"))]


def ratio(signals: dict[str, float], spec: str) -> float | None:
    top, _, bottom = spec.partition("/")
    if not bottom:
        return signals.get(top, 0.0)
    return signals.get(top, 0.0) / signals[bottom] if signals.get(bottom) else None


def spread(values: list[float], scale: float) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.1f} ± {std:.1f} [{min(values) * scale:.1f}, {max(values) * scale:.1f}]"


def table(run: Path, stage: str, ratios: dict[str, str]) -> str:
    seeds = seed_rows(run, stage)
    head = ["task", "model", "split", "greedy acc %", *(f"{n} ({s})" for n, s in ratios.items())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, models in seeds[0].items():
        for model, splits in models.items():
            for split in splits:
                cells = [s[task][model][split] for s in seeds]
                acc = [c["metrics"]["greedy_accuracy"]["value"] for c in cells]
                signals = [c.get("episodes", {}).get("signals", {}) for c in cells]
                row = [task, model, split, spread(acc, 100)]
                for spec in ratios.values():
                    got = [v for v in (ratio(sig, spec) for sig in signals) if v is not None]
                    row.append(spread(got, 100 if "/" in spec else 1))
                lines.append("| " + " | ".join(row) + " |")
    return f"{len(seeds)} seeds ({', '.join(d.name for d in sorted(run.glob('seed-*')))})\n\n" + "\n".join(
        lines
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a multiseed run folder (seed-*/ inside)")
    parser.add_argument("--eval", default="06-eval", help="the eval stage's folder name")
    parser.add_argument("--ratio", action="append", default=[], metavar="NAME=A[/B]")
    parser.add_argument("--out", type=Path, help="append the table to this markdown file")
    args = parser.parse_args()
    ratios = dict(spec.split("=", 1) for spec in args.ratio)
    text = table(args.run, args.eval, ratios)
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(
                f"\n\n## Episode signals (`{' '.join(['experiments/episode_signals.py', str(args.run)])}`)\n\n{text}\n"
            )


if __name__ == "__main__":
    main()
