"""Summarize the milestone-reward experiment (recipes/milestones_code_repair.yaml) over seeds: does
success rise faster with verified milestone rewards (MiRA-style) than with the outcome alone?

Per arm and seed, from the RL stage's metrics.jsonl (sampled training episodes): success in blocks
of `--block` steps, the least-squares slope of success per step, and the milestone rates per
episode at the end; from the eval stage: greedy test success. Cells: mean ± sample std [min, max]
over seeds; the paired milestone - outcome difference per seed with a 95% t-interval.

    python experiments/milestones.py runs/milestones_code_repair --seeds 0 1 2
"""

from __future__ import annotations

from pathlib import Path

from tables import cli, greedy, metrics, paired, spread, table

ARMS = {"outcome only": "rl_outcome", "outcome + milestones": "rl_milestone"}
MILESTONES = ("failure_reproduced", "tests_after_edit", "fix_applied")


def slope(values: list[float]) -> float:
    """Least-squares slope of values against their step index."""
    n = len(values)
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum((i - mx) ** 2 for i in range(n))


def summarize(root: Path, seeds: list[int], block: int) -> str:
    runs = [root / f"seed-{s}" for s in seeds]
    rows = {arm: [metrics(run, name) for run in runs] for arm, name in ARMS.items()}
    steps = min(len(r) for per in rows.values() for r in per)
    blocks = [(i, min(i + block, steps)) for i in range(0, steps, block)]
    lines = [
        f"# Milestone rewards on code_repair: outcome-only vs outcome + milestones, {len(seeds)} seeds "
        f"({', '.join(map(str, seeds))})",
        "",
        "Training success (sampled episodes) by block of steps; mean ± std [min, max] over seeds.",
        "",
    ]
    success = {arm: [[r["accuracy"] for r in run[:steps]] for run in per] for arm, per in rows.items()}
    lines += table(
        ["arm", *(f"steps {a + 1}-{b} %" for a, b in blocks), "slope (pp/step)"],
        [
            [
                arm,
                *(spread([sum(s[a:b]) / (b - a) for s in per], 100, 1) for a, b in blocks),
                spread([slope(s) for s in per], 100, 2),
            ]
            for arm, per in success.items()
        ],
    )
    a, b = success["outcome only"], success["outcome + milestones"]
    lines += [
        "",
        "Paired milestones - outcome-only: slope "
        f"{paired([slope(s) for s in a], [slope(s) for s in b], 100, 2)} pp/step; success over the last "
        f"block {paired([sum(s[blocks[-1][0] :]) / len(s[blocks[-1][0] :]) for s in a], [sum(s[blocks[-1][0] :]) / len(s[blocks[-1][0] :]) for s in b], 100, 1)} pp.",
        "",
        "Milestones per episode over the last block (training episodes):",
        "",
    ]
    last = {arm: [run[blocks[-1][0] : steps] for run in per] for arm, per in rows.items()}
    lines += table(
        ["arm", *MILESTONES],
        [
            [
                arm,
                *(
                    spread([sum(r.get(f"signal/{m}", 0.0) for r in run) / len(run) for run in runs_])
                    for m in MILESTONES
                ),
            ]
            for arm, runs_ in last.items()
        ],
    )
    test = {arm: [greedy(run, "code_repair", name, "test") for run in runs] for arm, name in ARMS.items()}
    lines += [
        "",
        "Greedy test success (40 held-out tasks): "
        + "; ".join(f"{arm} {spread(v, 100, 1)}" for arm, v in test.items())
        + f"; paired {paired(test['outcome only'], test['outcome + milestones'], 100, 1)} pp.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    cli(__doc__, summarize, {"block": (int, 3, "steps per block of the success table")})
