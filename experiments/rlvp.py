"""Summarize the RLVP experiment (recipes/rlvp_code_repair.yaml) over seeds: outcome-only GRPO vs
outcome + verified path rewards, from the same SFT model at equal compute.

Per arm and seed, from the RL stage's metrics.jsonl (sampled training episodes, temperature 1):
success (the share of episodes whose hidden tests pass), violations per episode (every signal the
task declares a "violation", summed) and the share of all-fail groups (no episode of the group
correct: `path/all_fail_groups`) and of no-signal groups (all rewards equal, outcome and path
together: `zero_variance`, what GRPO cannot learn from), each at the start (mean of the first `--window` steps) and the
end (mean of the last `--window`). From the eval stage (greedy and sampled episodes on held-out
problems): success (greedy accuracy) and violations per episode. Table cells: mean ± sample std
[min, max] over seeds; the paired RLVP - outcome difference per seed with its 95% t-interval.

    python experiments/rlvp.py runs/rlvp_code_repair --seeds 0 1 2 --out results/rlvp_code_repair.md
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tables import cli, eval_result, mean, metrics, paired, spread, stage, table

from temper.envs.code_repair.env import PATH_SIGNALS

VIOLATIONS = sorted(s for s, kind in PATH_SIGNALS.items() if kind == "violation")
ARMS = {"outcome only": "rl_outcome", "outcome + path (RLVP)": "rl_rlvp"}


def train_figures(rows: list[dict], window: int) -> dict[str, float]:
    """Start and end means over `window` steps of success, violations per episode, all-fail share."""
    out = {}
    for when, part in (("start", rows[:window]), ("end", rows[-window:])):
        out[f"success/{when}"] = mean([r["accuracy"] for r in part])
        out[f"violations/{when}"] = mean([r.get("path/violations", 0.0) for r in part])
        out[f"all_fail/{when}"] = mean([r.get("path/all_fail_groups", 0.0) for r in part])
        out[f"no_signal/{when}"] = mean([r.get("zero_variance", 0.0) for r in part])
    return out


def eval_figures(run: Path, model: str, split: str) -> dict[str, float]:
    result = eval_result(run, "code_repair", model, split)
    signals = result["episodes"]["signals"]
    return {
        "greedy": result["metrics"]["greedy_accuracy"]["value"],
        "violations": sum(signals.get(s, 0.0) for s in VIOLATIONS),
        **{f"violations/{s}": signals.get(s, 0.0) for s in VIOLATIONS},
    }


def summarize(root: Path, seeds: list[int], window: int) -> str:
    runs = {s: root / f"seed-{s}" for s in seeds}
    train = {
        arm: [train_figures(metrics(run, name), window) for run in runs.values()]
        for arm, name in ARMS.items()
    }
    lines = [
        f"# RLVP on code_repair: outcome-only vs outcome + path rewards, {len(seeds)} seeds "
        f"({', '.join(map(str, seeds))})",
        "",
        f"RL training episodes (sampled, temperature 1; start = mean of the first {window} steps, "
        f"end = the last {window}). Mean ± std [min, max] over seeds.",
        "",
    ]
    header = [
        "arm",
        "success start %",
        "success end %",
        "violations/episode start",
        "violations/episode end",
        "all-fail groups start %",
        "all-fail groups end %",
        "no-signal groups start %",
        "no-signal groups end %",
    ]
    rows = []
    for arm, figs in train.items():
        rows.append(
            [
                arm,
                spread([f["success/start"] for f in figs], 100, 1),
                spread([f["success/end"] for f in figs], 100, 1),
                spread([f["violations/start"] for f in figs]),
                spread([f["violations/end"] for f in figs]),
                spread([f["all_fail/start"] for f in figs], 100, 1),
                spread([f["all_fail/end"] for f in figs], 100, 1),
                spread([f["no_signal/start"] for f in figs], 100, 1),
                spread([f["no_signal/end"] for f in figs], 100, 1),
            ]
        )
    lines += table(header, rows)
    a, b = train["outcome only"], train["outcome + path (RLVP)"]
    lines += [
        "",
        "Paired RLVP - outcome-only at the end of training (per seed, and a 95% t-interval over seeds): "
        f"success {paired([f['success/end'] for f in a], [f['success/end'] for f in b], 100, 1)} pp; "
        f"violations/episode {paired([f['violations/end'] for f in a], [f['violations/end'] for f in b])}; "
        f"all-fail groups {paired([f['all_fail/end'] for f in a], [f['all_fail/end'] for f in b], 100, 1)} pp; "
        f"no-signal groups {paired([f['no_signal/end'] for f in a], [f['no_signal/end'] for f in b], 100, 1)} pp.",
        "",
    ]
    splits = list(json.loads((stage(runs[seeds[0]], "eval") / "eval.json").read_text())["code_repair"]["sft"])
    lines += [
        "Eval on held-out episodes (greedy success; violations per episode over the greedy and sampled "
        f"episodes; {', '.join(VIOLATIONS)} summed):",
        "",
    ]
    models = {"sft (shared start)": "sft"} | dict(ARMS)
    ev = {
        (label, split): [eval_figures(run, model, split) for run in runs.values()]
        for label, model in models.items()
        for split in splits
    }
    rows = []
    for (label, split), figs in ev.items():
        cells = [
            label,
            split,
            spread([f["greedy"] for f in figs], 100, 1),
            spread([f["violations"] for f in figs]),
        ]
        cells += [f"{statistics.mean([f[f'violations/{s}'] for f in figs]):.3f}" for s in VIOLATIONS]
        rows.append(cells)
    lines += table(["model", "split", "greedy success %", "violations/episode", *VIOLATIONS], rows)
    lines.append("")
    for split in splits:
        a, b = ev[("outcome only", split)], ev[("outcome + path (RLVP)", split)]
        lines.append(
            f"Paired RLVP - outcome-only on {split}: greedy success "
            f"{paired([f['greedy'] for f in a], [f['greedy'] for f in b], 100, 1)} pp; violations/episode "
            f"{paired([f['violations'] for f in a], [f['violations'] for f in b], 1, 3)}."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    cli(__doc__, summarize, {"window": (int, 3, "steps averaged at the start and the end")})
