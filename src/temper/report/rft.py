"""The rft stage's section: the per-round table (yield, data size, accuracy) and its plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from temper.report.common import Stage, embed_figure, html_table, number, percent, read_json
from temper.report.contamination import contamination_html


def rounds_figure(rounds: list[dict[str, Any]], title: str) -> Figure:
    """Greedy test accuracy (round 0 = the starting model) and the yield of each round's sampling."""
    fig = Figure(figsize=(6.5, 3.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(
        [r["round"] for r in rounds], [r["accuracy"] for r in rounds], "o-", label="greedy accuracy (test)"
    )
    sampled = [r for r in rounds if "yield" in r]
    ax.plot(
        [r["round"] for r in sampled], [r["yield"] for r in sampled], "s--", label="yield (train prompts)"
    )
    ax.set(title=title, xlabel="round", ylabel="share", ylim=(0, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def rft_section(stage: Stage, plots: Path) -> str:
    summary = read_json(stage.folder / "rft.json") or {}
    rounds = summary.get("rounds") or []
    if not rounds:
        return "<p>No round finished yet.</p>"
    head = [
        "round",
        "yield",
        "correct samples",
        "kept",
        "training rows",
        "steps",
        "final loss",
        "accuracy",
        "parse rate",
    ]
    rows = [
        [
            r["round"] if r["round"] else "0 (start)",
            percent(r["yield"]) if "yield" in r else "–",
            f"{r['correct_samples']:,} of {r['samples']:,}" if "samples" in r else "–",
            number(r["kept"]) if "kept" in r else "–",
            number(r["data_size"]) if "data_size" in r else "–",
            number(r["steps"]) if "steps" in r else "–",
            number(r["final_loss"]) if "final_loss" in r else "–",
            f"{100 * r['accuracy']:.1f}%",
            percent(r["parse_rate"]),
        ]
        for r in rounds
    ]
    teacher = summary.get("teacher")
    writer = (
        f"the teacher {teacher['name']!r} (CoT distillation; its greedy accuracy {100 * teacher['accuracy']:.1f}%)"
        if teacher
        else "the previous round's model"
    )
    said = (
        f"<p>Each round samples {summary.get('k')} completions of {summary.get('prompts')} train prompts from "
        f"{writer}, keeps the verified-correct ones (deduplicated; keep: {summary.get('keep')}"
        f"{', every round so far' if summary.get('accumulate') else ''}) and fine-tunes on them. Yield: the share "
        "of prompts with at least one correct sample. Accuracy: greedy, on held-out test problems.</p>"
    )
    name = stage.folder.name
    fig = embed_figure(rounds_figure(rounds, name), plots / f"{name}-rounds.png", f"{name} rounds")
    checks = [r["contamination"] for r in rounds if r.get("contamination")]
    return (
        said
        + html_table(rows, head, caption="per round")
        + fig
        + contamination_html(checks[-1] if checks else None, f"samples of round {rounds[-1]['round']}")
    )
