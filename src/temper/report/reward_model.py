"""The section of a reward-model stage: loss and pair-accuracy curves (train and held out), the
calibration of its Bradley-Terry probability on held-out pairs, and the run's counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from temper.report.common import (
    Stage,
    boxes,
    embed_figure,
    html_table,
    number,
    percent,
    read_json,
    read_metrics,
)


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[Any, float]]:
    return [
        (r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]


def curves_figure(
    rows: list[dict[str, Any]], title: str, initial_accuracy: float | None = None
) -> Figure | None:
    """Bradley-Terry loss (left) and pair accuracy r_c > r_r (right) over steps, train as a line
    (each step's batch) and held-out as points, the untrained head's held-out accuracy at step 0;
    None when nothing was logged."""
    series = {k: _points(rows, k) for k in ("loss", "eval/loss", "accuracy", "eval/accuracy")}
    if initial_accuracy is not None and series["eval/accuracy"]:
        series["eval/accuracy"].insert(0, (0, initial_accuracy))
    if not any(series.values()):
        return None
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    for ax, key, what in ((ax_loss, "loss", "loss"), (ax_acc, "accuracy", "pair accuracy")):
        if series[key]:
            ax.plot(*zip(*series[key], strict=True), lw=1.5, label=f"train {what}")
        if series[f"eval/{key}"]:
            ax.plot(*zip(*series[f"eval/{key}"], strict=True), "o-", color="C3", label=f"held-out {what}")
        ax.set(xlabel="step", ylabel=what)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    ax_loss.axhline(math.log(2), color="gray", ls=":", lw=1)  # -log sigma(0): rewards that tell nothing apart
    ax_acc.axhline(0.5, color="gray", ls=":", lw=1)
    ax_acc.set_ylim(-0.02, 1.02)
    ax_loss.set_title(f"{title}: Bradley-Terry loss (dotted: log 2, chance)")
    ax_acc.set_title("accuracy: r(chosen) > r(rejected) (dotted: chance)")
    return fig


def calibration_figure(calibration: dict[str, Any], title: str) -> Figure | None:
    """Reliability diagram: per confidence bin, the held-out pairs' accuracy against their mean
    confidence max(p, 1 - p), p = sigma(r_c - r_r); on the diagonal when calibrated. Bar widths
    are the bins, their labels the pairs in each."""
    bins = [b for b in calibration.get("bins", []) if b["n"]]
    if not bins:
        return None
    fig = Figure(figsize=(5.5, 4.6), layout="constrained")
    ax = fig.subplots()
    ax.plot([0.5, 1], [0.5, 1], color="gray", ls="--", lw=1, label="calibrated")
    for b in bins:
        ax.bar(
            (b["lo"] + b["hi"]) / 2,
            b["accuracy"],
            width=b["hi"] - b["lo"],
            alpha=0.35,
            color="C0",
            edgecolor="C0",
        )
        ax.annotate(f"n={b['n']}", ((b["lo"] + b["hi"]) / 2, 0.02), ha="center", va="bottom", fontsize=8)
    ax.plot(
        [b["confidence"] for b in bins],
        [b["accuracy"] for b in bins],
        "o-",
        color="C3",
        label="held-out pairs",
    )
    ece = calibration.get("ece")
    ax.set(
        xlim=(0.5, 1),
        ylim=(0, 1.05),
        xlabel="confidence max(p, 1-p), p = sigmoid(r_c - r_r)",
        ylabel="accuracy (r_c > r_r)",
        title=f"{title}: calibration" + (f" (ECE {ece:.3f})" if ece is not None else ""),
    )
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2)  # below the axes: inside, it hides bars or labels
    return fig


def reward_model_section(stage: Stage, plots: Path) -> str:
    rows, bad = read_metrics(stage.folder / "metrics.jsonl")
    summary = read_json(stage.folder / "reward_model.json") or {}
    name = stage.folder.name
    parts = [boxes(bad)]
    fig = curves_figure(rows, name, summary.get("held_out_accuracy_initial"))
    parts.append(
        embed_figure(fig, plots / f"{name}-curves.png", f"{name} loss and accuracy")
        if fig
        else "<p>No metrics logged.</p>"
    )
    acc = summary.get("held_out_accuracy")
    if summary and acc is None:
        parts.append(
            boxes(
                [
                    "no held-out pairs: give data.eval_files or data.generate.eval_prompts to measure accuracy and calibration"
                ]
            )
        )
    cal = summary.get("calibration") or {}
    cal_fig = calibration_figure(cal, name) if cal else None
    if cal_fig is not None:
        parts.append(embed_figure(cal_fig, plots / f"{name}-calibration.png", f"{name} calibration"))
        parts.append(
            html_table(
                [
                    [f"{b['lo']:.1f}-{b['hi']:.1f}", b["n"]]
                    + ([f"{b['confidence']:.3f}", f"{b['accuracy']:.3f}"] if b["n"] else ["–", "–"])
                    for b in cal["bins"]
                ],
                head=("confidence bin", "pairs", "mean confidence", "accuracy"),
                caption="calibration on held-out pairs",
            )
        )
    shown = [
        ["held-out accuracy", f"{100 * acc:.1f}%" if acc is not None else "–"],
        [
            "held-out accuracy before training",
            f"{100 * summary['held_out_accuracy_initial']:.1f}%"
            if summary.get("held_out_accuracy_initial") is not None
            else "–",
        ],
        ["held-out mean margin r_c - r_r", number(summary.get("held_out_mean_margin", "–"))],
        ["held-out pairs", summary.get("held_out_pairs", "–")],
        ["ECE", number(cal.get("ece", "–"))],
    ]
    shown += [
        [k, number(summary[k])]
        for k in ("steps", "final_loss", "eval_loss", "tokens", "seconds")
        if summary.get(k) is not None
    ]
    if summary.get("reward_model"):
        shown.append(["saved to", summary["reward_model"]])
    parts.append(html_table(shown, caption="summary"))
    counts = [
        [f"data: {k}", v]
        for k, v in (summary.get("data") or {}).items()
        if k not in ("desirable", "undesirable")
    ]
    for split, by_task in (summary.get("generated") or {}).items():
        for task, c in by_task.items():
            counts.append([f"generated ({split}) {task}: pairs / prompts", f"{c['pairs']} / {c['prompts']}"])
            counts.append(
                [
                    f"generated ({split}) {task}: no pair",
                    f"{percent(c['no_pair_share'])} {c['no_pair'] or ''}",
                ]
            )
    counts += [[f"skipped rows: {f}", n] for f, n in (summary.get("skipped_rows") or {}).items()]
    flagged = {
        i
        for i, (k, v) in enumerate(counts)
        if v and k.startswith(("data: truncated", "data: dropped", "skipped"))
    }
    parts.append(html_table(counts, flagged=flagged, caption="data (highlighted: rows lost or cut)"))
    return "".join(parts)
