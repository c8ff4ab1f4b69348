"""Summarize a milestone-reward experiment over seeds (recipes/milestones_code_repair.yaml,
recipes/agent_shell_repo.yaml with `--task shell_repo`): does success rise faster with verified
milestone rewards (MiRA-style) than with the outcome alone?

Per arm and seed, from the RL stage's metrics.jsonl (sampled training episodes): success in blocks
of `--block` steps, the least-squares slope of success per step, and the milestone rates per
episode at the end (the task's `progress` path signals) and its rule violations; from the eval
stage: greedy success on each split the eval ran. Cells: mean ± sample std [min, max]
over seeds; the paired milestone - outcome difference per seed with a 95% t-interval.

    python experiments/milestones.py runs/milestones_code_repair --seeds 0 1 2
    python experiments/milestones.py runs/agent_shell_repo --seeds 0 1 2 --task shell_repo
"""

from __future__ import annotations

from pathlib import Path

from tables import cli, greedy, metrics, paired, spread, table

ARMS = {"outcome only": "rl_outcome", "outcome + milestones": "rl_milestone"}


def path_signals(task: str, kind: str) -> list[str]:
    """The task's path signals of `kind` ("progress": milestones, "violation": broken rules)."""
    from temper.catalog import TASKS

    return [name for name, k in TASKS[task].path_signals.items() if k == kind]


def slope(values: list[float]) -> float:
    """Least-squares slope of values against their step index."""
    n = len(values)
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum((i - mx) ** 2 for i in range(n))


def summarize(root: Path, seeds: list[int], block: int, task: str) -> str:
    milestones, violations = path_signals(task, "progress"), path_signals(task, "violation")
    runs = [root / f"seed-{s}" for s in seeds]
    rows = {arm: [metrics(run, name) for run in runs] for arm, name in ARMS.items()}
    steps = min(len(r) for per in rows.values() for r in per)
    blocks = [(i, min(i + block, steps)) for i in range(0, steps, block)]
    lines = [
        f"# Milestone rewards on {task}: outcome-only vs outcome + milestones, {len(seeds)} seeds "
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
        "Milestones and rule violations per episode over the last block (training episodes):",
        "",
    ]
    last = {arm: [run[blocks[-1][0] : steps] for run in per] for arm, per in rows.items()}
    lines += table(
        ["arm", *milestones, *violations],
        [
            [
                arm,
                *(
                    spread([sum(r.get(f"signal/{m}", 0.0) for r in run) / len(run) for run in runs_])
                    for m in (*milestones, *violations)
                ),
            ]
            for arm, runs_ in last.items()
        ],
    )
    for split in splits(runs[0], task):
        got = {arm: [greedy(run, task, name, split) for run in runs] for arm, name in ARMS.items()}
        start = ""
        if all(_has(run, task, split, "sft") for run in runs):
            start = f"SFT {spread([greedy(run, task, 'sft', split) for run in runs], 100, 1)}; "
        lines += [
            "",
            f"Greedy {split} success: {start}"
            + "; ".join(f"{arm} {spread(v, 100, 1)}" for arm, v in got.items())
            + f"; paired {paired(got['outcome only'], got['outcome + milestones'], 100, 1)} pp.",
        ]
    return "\n".join(lines) + "\n"


def splits(run: Path, task: str) -> list[str]:
    """The splits the run's eval stage scored `task` on (test first; none without an eval)."""
    found = [s for s in ("test", "ood", "train") if _has(run, task, s)]
    return found


def _has(run: Path, task: str, split: str, model: str = ARMS["outcome only"]) -> bool:
    try:
        greedy(run, task, model, split)
    except (KeyError, FileNotFoundError, StopIteration, IndexError):
        return False
    return True


if __name__ == "__main__":
    cli(
        __doc__,
        summarize,
        {
            "block": (int, 3, "steps per block of the success table"),
            "task": (str, "code_repair", "the environment task (its path signals name the columns)"),
        },
    )
