"""Summarize R1-Zero vs cold start (recipes/r1_zero_format_aware.yaml) over seeds: does GRPO
straight from a base that has seen the chat format learn, and how does it compare with a short
cold-start SFT followed by the same GRPO?

Per arm and seed, from the RL stage's metrics.jsonl: the parse rate, reward and accuracy of the
sampled training groups in blocks of `--block` steps, and the stage's periodic greedy evals; from
the eval stage: greedy accuracy and parse rate of every model on the test split. Cells: mean ±
sample std [min, max] over seeds; paired differences per seed with a 95% t-interval. `--plot`
draws the training curves, the mean over seeds with the min-max band.

    python experiments/r1_zero.py runs/r1_zero_format_aware --seeds 0 1 2 \
        --out results/r1_zero_format_aware.md --plot results/r1_zero_format_aware.png
"""

from __future__ import annotations

import json
from pathlib import Path

from tables import cli, eval_result, metrics, paired, spread, stage, table

LABELS = {"zero": "zero (GRPO from the mid-trained base)", "after_cold_start": "cold start SFT + GRPO"}
CURVES = {"parse rate %": "parse_rate", "mean reward": "reward", "accuracy %": "accuracy"}
SCALE = {"parse_rate": (100, 1), "reward": (1, 3), "accuracy": (100, 1)}  # (factor, digits) per curve
MODELS = ["midtrain", "zero", "cold_start", "after_cold_start"]  # the eval's models, where present
PAIRS = [("midtrain", "zero"), ("zero", "after_cold_start")]  # (a, b): b - a per seed, where both are


def blocks(steps: int, block: int) -> list[tuple[int, int]]:
    """[start, end) step-index ranges of `block` steps covering `steps` (the last may be shorter)."""
    return [(i, min(i + block, steps)) for i in range(0, steps, block)]


def block_means(values: list[float], ranges: list[tuple[int, int]]) -> list[float]:
    return [sum(values[a:b]) / (b - a) for a, b in ranges]


def evals(rows: list[dict], task: str) -> dict[int, tuple[float, float]]:
    """{step: (greedy accuracy, parse rate)} of an RL stage's periodic evals."""
    key = f"eval/{task}/accuracy"
    return {r["step"]: (r[key], r[f"eval/{task}/parse_rate"]) for r in rows if key in r}


def summarize(root: Path, seeds: list[int], block: int, task: str, plot: str | None, arms: str) -> str:
    runs = [root / f"seed-{s}" for s in seeds]
    rows = {LABELS.get(name, name): [metrics(run, name) for run in runs] for name in arms.split(",")}
    steps = min(len(r) for per in rows.values() for r in per)
    ranges = blocks(steps, block)
    lines = [
        f"# R1-Zero: {' vs '.join(rows)} on {task}, {len(seeds)} seeds ({', '.join(map(str, seeds))})",
        "",
        "Final models, greedy on the test split (the eval stage); mean ± std [min, max] over seeds, %.",
        "",
    ]
    evaluated = json.loads((stage(runs[0], "eval") / "eval.json").read_text())[task]
    models = [m for m in MODELS if m in evaluated]
    final = {m: [eval_result(run, task, m, "test")["metrics"] for run in runs] for m in models}
    lines += table(
        ["model", "greedy accuracy %", "parse rate %"],
        [
            [
                m,
                spread([f["greedy_accuracy"]["value"] for f in final[m]], 100, 1),
                spread([f["parse_rate"]["value"] for f in final[m]], 100, 1),
            ]
            for m in models
        ],
    )
    acc = {m: [f["greedy_accuracy"]["value"] for f in final[m]] for m in models}
    parse = {m: [f["parse_rate"]["value"] for f in final[m]] for m in models}
    gaps = [
        f"{b} - {a} accuracy {paired(acc[a], acc[b], 100, 1)}, parse {paired(parse[a], parse[b], 100, 1)}"
        for a, b in PAIRS
        if a in final and b in final
    ]
    lines += [
        "",
        "Paired per seed (pp, 95% t-interval): " + "; ".join(gaps) + ".",
        "",
        f"Training groups (sampled at temperature 1), blocks of {block} steps:",
        "",
    ]
    for label, key in CURVES.items():
        lines += table(
            ["arm", *(f"{label} steps {a + 1}-{b}" for a, b in ranges)],
            [
                [
                    arm,
                    *(
                        spread(list(v), *SCALE[key])
                        for v in zip(
                            *(block_means([r[key] for r in run[:steps]], ranges) for run in per), strict=True
                        )
                    ),
                ]
                for arm, per in rows.items()
            ],
        )
        lines.append("")
    periodic = {arm: [evals(run, task) for run in per] for arm, per in rows.items()}
    at = sorted(set.intersection(*(set(e) for per in periodic.values() for e in per)))
    if at:
        lines += ["The RL stages' own greedy evals (accuracy / parse rate, %), by step:", ""]
        lines += table(
            ["arm", *(f"step {s}" for s in at)],
            [
                [
                    arm,
                    *(
                        f"{spread([e[s][0] for e in per], 100, 1)} / {spread([e[s][1] for e in per], 100, 1)}"
                        for s in at
                    ),
                ]
                for arm, per in periodic.items()
            ],
        )
    if plot:
        draw(rows, steps, plot, f"R1-Zero on {task}, {len(seeds)} seeds")
    return "\n".join(lines) + "\n"


def draw(rows: dict[str, list[list[dict]]], steps: int, path: str, title: str) -> None:
    """One panel per training curve: the mean over seeds and the min-max band, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.4))
    x = list(range(1, steps + 1))
    for ax, (label, key) in zip(axes, CURVES.items(), strict=True):
        for arm, per in rows.items():
            series = [[r[key] * SCALE[key][0] for r in run[:steps]] for run in per]
            mean = [sum(v) / len(v) for v in zip(*series, strict=True)]
            ax.plot(x, mean, label=arm)
            ax.fill_between(x, [min(v) for v in zip(*series)], [max(v) for v in zip(*series)], alpha=0.2)
        ax.set_xlabel("RL step")
        ax.set_title(label)
        ax.set_ylim(-0.02 * SCALE[key][0], (1.22 if key == "reward" else 1.02) * SCALE[key][0])
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    cli(
        __doc__,
        summarize,
        {
            "block": (int, 10, "steps per block of the training curves"),
            "task": (str, "arithmetic", "the task of the RL stages and the eval"),
            "plot": (str, None, "PNG of the training curves"),
            "arms": (str, "zero,after_cold_start", "the RL stages to compare, comma-separated"),
        },
    )
