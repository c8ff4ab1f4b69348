"""Summarize the orchestrator RL experiment (recipes/agent_orchestrator.yaml, PARL-style) over
seeds: the parallel reward annealed to 0 (schedule linear) vs kept at its initial weight
(schedule constant), and, where it was run, without the parallel term (weight 0: success and
the completion penalty only), all from the same SFT start.

Per arm and seed, from the RL stage's metrics.jsonl (sampled training episodes): success, the
critical path and the total steps per episode, spawn turns per episode and w(t), at the first
step, over steps 2-6 (while the annealed weight is above 0) and over the last `--last` steps; from the eval stage: greedy success and, per episode
(greedy and sampled), the critical path and total steps, for the SFT start and the RL model.
Cells: mean ± sample std [min, max] over seeds; each other arm's paired difference from the annealed one per seed
with a 95% t-interval.

    python experiments/multiseed.py recipes/agent_orchestrator.yaml --seeds 0 1 2 --vary rl \\
        --grid stages.rl.train.parallel.schedule=linear,constant --workers 1 --threads 1
    python experiments/multiseed.py recipes/agent_orchestrator.yaml --seeds 0 1 2 --vary rl \\
        --grid stages.rl.train.parallel.weight=0 --workers 1 --threads 1
    python experiments/multiseed.py ... --grid stages.rl.train.advantage=dr_grpo --grid ...  # the same arms
    python experiments/orchestrator_parl.py runs/agent_orchestrator --out results/orchestrator_parl.md
"""

from __future__ import annotations

from pathlib import Path

from tables import cli, eval_result, metrics, paired, spread, table

ARMS = {"annealed (linear)": "schedule=linear", "constant": "schedule=constant", "w0 = 0": "weight=0"}
"""Arm -> its folder under the run folder (an arm whose folders are missing is left out)."""
FAMILIES = {"grpo (the recipe's)": "", "dr_grpo": "advantage=dr_grpo,"}
"""Advantage estimator -> the prefix of its arms' folders (a grid over `stages.rl.train.advantage`)."""
TRAIN = {
    "success %": ("reward/outcome", 100, 1),
    "critical path": ("parallel/critical_path", 1, 2),
    "total steps": ("parallel/total_steps", 1, 2),
    "spawn turns": ("parallel/spawns", 1, 2),
    "w(t)": ("parallel/weight", 1, 3),
}


def _episodes(run: Path, model: str, split: str) -> dict[str, float]:
    r = eval_result(run, "orchestrator", model, split)
    e = r["episodes"]
    return {"success": r["metrics"]["greedy_accuracy"]["value"], "critical": e["signals"].get("critical_steps", 0.0),
            "total": e["signals"].get("steps", 0.0), "spawns": e["signals"].get("spawns", 0.0)}  # fmt: skip


def _mean(rows: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in rows) / len(rows)


def summarize(root: Path, seeds: list[int], last: int) -> str:
    lines = [
        f"# Orchestrator RL (PARL): the parallel reward annealed, constant or off, {len(seeds)} seeds "
        f"({', '.join(map(str, seeds))})",
        "",
    ]
    for family, prefix in FAMILIES.items():
        if all(
            (root / f"{prefix}{ARMS['annealed (linear)']}" / f"seed-{s}" / "04-eval").is_dir() for s in seeds
        ):
            lines += [f"## advantage: {family}", "", *_section(root, seeds, last, prefix)]
    return "\n".join(lines) + "\n"


def _section(root: Path, seeds: list[int], last: int, prefix: str) -> list[str]:
    runs = {arm: [root / f"{prefix}{cell}" / f"seed-{s}" for s in seeds] for arm, cell in ARMS.items()}
    runs = {arm: per for arm, per in runs.items() if all((run / "04-eval").is_dir() for run in per)}
    rows = {arm: [metrics(run, "rl") for run in per] for arm, per in runs.items()}
    lines = [
        f"Training episodes (sampled), per episode: step 1, steps 2-6 and the mean of the last {last} "
        "steps; mean ± std [min, max] over seeds.",
        "",
    ]
    body = []
    for arm, per in rows.items():
        for name, (key, scale, digits) in TRAIN.items():
            first = [r[0].get(key, 0.0) for r in per]
            early = [_mean(r[1:6], key) for r in per]
            end = [_mean(r[-last:], key) for r in per]
            body.append([arm, name, *(spread(v, scale, digits) for v in (first, early, end))])
    lines += table(["arm", "metric", "step 1", "steps 2-6", f"last {last} steps"], body)
    lines += ["", "Paired differences from the annealed arm in training, same seed (steps 2-6; mean, per "
              "seed, 95% t-interval):", ""]  # fmt: skip
    body = []
    for arm in [a for a in rows if a != "annealed (linear)"]:
        cells = []
        for key, scale, digits in (TRAIN["success %"], TRAIN["critical path"], TRAIN["spawn turns"]):
            a = [_mean(r[1:6], key) for r in rows["annealed (linear)"]]
            cells.append(paired(a, [_mean(r[1:6], key) for r in rows[arm]], scale, digits))
        body.append([f"{arm} - annealed", *cells])
    lines += table(["", "success (pp)", "critical path", "spawn turns"], body)
    lines += ["", "Eval (64 problems per split; success greedy, steps per episode over greedy and sampled "
              "episodes); test: unseen problems of 2-4 sub-tasks, ood: 5 sub-tasks.", ""]  # fmt: skip
    body = []
    for split in ("test", "ood"):
        sft = [_episodes(run, "sft", split) for run in runs["annealed (linear)"]]
        body.append(["SFT start", split, *(spread([e[k] for e in sft], s, d) for k, s, d in _COLS)])
        for arm, per in runs.items():
            got = [_episodes(run, "rl", split) for run in per]
            body.append([f"RL, {arm}", split, *(spread([e[k] for e in got], s, d) for k, s, d in _COLS)])
    lines += table(["model", "split", "success %", "critical path", "total steps", "spawn turns"], body)
    lines += ["", "Paired differences from the annealed arm, same seed (mean, per seed, 95% t-interval):", ""]
    body = []
    for arm in [a for a in runs if a != "annealed (linear)"]:
        for split in ("test", "ood"):
            a = [_episodes(run, "rl", split) for run in runs["annealed (linear)"]]
            b = [_episodes(run, "rl", split) for run in runs[arm]]
            cells = (paired([x[k] for x in a], [y[k] for y in b], s, d) for k, s, d in _COLS)
            body.append([f"{arm} - annealed", f"eval {split}", *cells])
    lines += table(["", "split", "success (pp)", "critical path", "total steps", "spawn turns"], body)
    return [*lines, ""]


_COLS = (("success", 100, 1), ("critical", 1, 2), ("total", 1, 2), ("spawns", 1, 2))


if __name__ == "__main__":
    cli(__doc__, summarize, {"last": (int, 3, "training steps averaged at the end")})
