"""Summarize on-policy distillation runs over seeds (recipes/on_policy_distillation.yaml, recipes/opsd.yaml):
how many optimizer steps does each arm need to reach the accuracy the baseline (GRPO) ends at?

Target, per seed: the baseline's plateau, the mean sampled training accuracy over its last
`--plateau` steps (the quantity RL improves; greedy accuracy barely moves in a few hundred GRPO
steps at this scale, see results/README.md's GRPO quickstart). Steps to target: the first step
s >= `--window` at which an arm's mean sampled accuracy over steps s-window+1..s reaches it (one
optimizer step per RL step here), or "not reached" within the run. A full window is required: a
trailing mean over fewer steps (step 1 alone) crosses a flat target by noise. Ratio: an arm's steps
to target over the baseline's, per seed. The distillation arms never train on the outcome; it is
graded and logged only. Also: the training curves (window means), the greedy held-out accuracy at
the periodic evals, the eval stage's table and each arm's per-seed difference from the baseline.

    python experiments/distill.py runs/on_policy_distillation --seeds 0 1 2 --out results/on_policy_distillation.md
    python experiments/distill.py runs/opsd --arms grpo,opsd,opsd_frozen --out results/opsd.md
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tables import cli, metrics, paired, spread, stage, table

NAMES = {
    "grpo": "GRPO (outcome)",
    "opd": "on-policy distillation",
    "opsd": "OPSD, live self-teacher",
    "opsd_frozen": "OPSD, frozen teacher (start)",
}


def window_means(values: list[float], window: int) -> list[float | None]:
    """Mean of steps s-window+1..s at each 1-based step s; None until a full window exists."""
    return [
        statistics.mean(values[i + 1 - window : i + 1]) if i + 1 >= window else None
        for i in range(len(values))
    ]


def steps_to(values: list[float], target: float, window: int) -> int | None:
    """First 1-based step whose full-window mean reaches `target`; None if never."""
    return next(
        (i + 1 for i, v in enumerate(window_means(values, window)) if v is not None and v >= target - 1e-12),
        None,
    )


def _cell(steps: int | None, budget: int) -> str:
    return f"> {budget}" if steps is None else str(steps)


def summarize(root: Path, seeds: list[int], arms: str, baseline: str, window: int, plateau: int) -> str:
    names = arms.split(",")
    runs = {s: root / f"seed-{s}" for s in seeds}
    acc = {a: {s: [r["accuracy"] for r in metrics(run, a)] for s, run in runs.items()} for a in names}
    rows = {a: {s: metrics(run, a) for s, run in runs.items()} for a in names}
    budget = len(acc[baseline][seeds[0]])
    targets = {s: statistics.mean(acc[baseline][s][-plateau:]) for s in seeds}
    firsts = {a: {s: statistics.mean(acc[a][s][:window]) for s in seeds} for a in names}
    lines = [
        f"# {root.name}: {', '.join(NAMES.get(a, a) for a in names)}; {len(seeds)} seeds ({', '.join(map(str, seeds))})",
        "",
        f"Target per seed: {NAMES.get(baseline, baseline)}'s plateau, its mean sampled accuracy over its last "
        f"{plateau} of {budget} steps: "
        + ", ".join(f"seed {s} {100 * t:.1f}%" for s, t in targets.items())
        + ". "
        f"Steps to target: the first step whose mean over the last {window} steps reaches it "
        f'("> {budget}": not within the run). Did the baseline rise? Its plateau minus its first {window} steps, '
        f"per seed (points, 95% t-interval): "
        + paired([firsts[baseline][s] for s in seeds], [targets[s] for s in seeds], 100, 1)
        + ".",
        "",
    ]
    steps = {a: {s: steps_to(acc[a][s], targets[s], window) for s in seeds} for a in names}
    body = []
    for a in names:
        end = [statistics.mean(acc[a][s][-plateau:]) for s in seeds]
        kl = [statistics.mean(r.get("kl_ref", float("nan")) for r in rows[a][s][-plateau:]) for s in seeds]
        ratio = ""
        if a != baseline:
            per = [
                "n/a" if steps[baseline][s] is None else
                (f"> {budget / steps[baseline][s]:.2f}" if steps[a][s] is None else f"{steps[a][s] / steps[baseline][s]:.2f}")
                for s in seeds
            ]  # fmt: skip
            ratio = ", ".join(per)
        body.append(
            [
                NAMES.get(a, a),
                ", ".join(_cell(steps[a][s], budget) for s in seeds),
                ratio,
                spread(list(firsts[a].values()), 100, 1),
                spread(end, 100, 1),
                "" if a == baseline else spread(kl, digits=3),
            ]
        )
    header = [
        "arm",
        "steps to target (per seed)",
        f"ratio to {baseline} (per seed)",
        f"sampled accuracy, first {window} steps %",
        f"sampled accuracy, last {plateau} steps %",
        f"reverse KL to teacher, last {plateau} steps (nats/token)",
    ]
    lines += table(header, body)
    for a in names:
        both = [steps[a][s] / steps[baseline][s] for s in seeds if steps[a][s] and steps[baseline][s]]
        if a != baseline and both:
            lines += [
                "",
                f"{NAMES.get(a, a)} / {NAMES.get(baseline, baseline)} steps to target, over the {len(both)} of "
                f"{len(seeds)} seeds where both reached it: {spread(both, digits=2)} (goal: <= 0.20).",
            ]
    every = max(window, budget // 10)
    marks = list(range(every, budget + 1, every))
    lines += [
        "",
        f"Training curve: mean sampled accuracy % over the {window} steps ending at each step, mean over seeds:",
        "",
    ]
    curve = []
    for a in names:
        means = [window_means(acc[a][s], window) for s in seeds]
        curve.append(
            [NAMES.get(a, a)] + [f"{100 * statistics.mean(m[k - 1] for m in means):.1f}" for k in marks]
        )
    lines += table(["arm"] + [f"step {k}" for k in marks], curve)
    evals = {a: [[(r["step"], r["eval/arithmetic/accuracy"]) for r in rows[a][s] if "eval/arithmetic/accuracy" in r] for s in seeds] for a in names}  # fmt: skip
    at = [k for k, _ in evals[baseline][0]]
    lines += [
        "",
        "Greedy held-out accuracy % at the periodic evals (200 test problems), mean over seeds:",
        "",
    ]
    lines += table(
        ["arm"] + [f"step {k}" for k in at],
        [
            [NAMES.get(a, a)]
            + [f"{100 * statistics.mean(e[i][1] for e in evals[a]):.1f}" for i in range(len(at))]
            for a in names
        ],
    )
    lines += eval_stage(runs, names, baseline)
    return "\n".join(lines) + "\n"


def eval_stage(runs: dict[int, Path], arms: list[str], baseline: str) -> list[str]:
    results = [
        json.loads((stage(run, "eval") / "eval.json").read_text())["arithmetic"] for run in runs.values()
    ]
    models = list(results[0])
    lines = ["", "Eval stage (300 problems; greedy and mean@4 sampled accuracy %):", ""]
    body = []
    for model in models:
        for split in results[0][model]:  # the splits the eval stage graded
            got = [r[model][split]["metrics"] for r in results]
            body.append([model, split, spread([g["greedy_accuracy"]["value"] for g in got], 100, 1), spread([g["mean@4"]["value"] for g in got], 100, 1)])  # fmt: skip
    lines += table(["model", "split", "greedy %", "mean@4 %"], body)
    lines += [
        "",
        f"Difference from {baseline} on the same 300 test problems (points; per seed, 95% t-interval over seeds):",
        "",
    ]
    body = []
    for a in arms:
        if a == baseline:
            continue
        cells = [
            paired(
                [r[baseline]["test"]["metrics"][key]["value"] for r in results],
                [r[a]["test"]["metrics"][key]["value"] for r in results],
                100,
                1,
            )
            for key in ("greedy_accuracy", "mean@4")
        ]
        body.append([NAMES.get(a, a), *cells])
    lines += table(["arm", "greedy", "mean@4"], body)
    return lines


if __name__ == "__main__":
    cli(
        __doc__,
        summarize,
        {
            "arms": (str, "grpo,opd", "comma-separated RL stage names"),
            "baseline": (str, "grpo", "the arm whose plateau is the target"),
            "window": (int, 20, "steps in the moving mean of sampled accuracy"),
            "plateau": (int, 50, "the baseline's last steps whose mean is the target"),
        },
    )
