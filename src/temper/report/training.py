"""The section of a supervised training stage (pretrain, sft): loss curve, throughput, data counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from temper.report.common import Stage, _box, _embed, _number, _read_json, _table, read_metrics


def loss_figure(rows: list[dict[str, Any]], title: str) -> Figure:
    """Train loss (and held-out loss points) over steps, the learning rate in a strip below."""
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    train = [(r["step"], r["loss"]) for r in rows if math.isfinite(r.get("loss", math.nan))]
    held = [(r["step"], r["eval_loss"]) for r in rows if r.get("eval_loss") is not None]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", lw=1.5)
    if held:
        ax.plot(*zip(*held, strict=True), "o", label="eval loss", color="C3")
    values = [v for _, v in train + held if math.isfinite(v)]
    if values and min(values) > 0 and max(values) / min(values) > 10:  # spans a decade: log shows both ends
        ax.set_yscale("log")
    ax.set(title=title, ylabel="loss")
    ax.grid(alpha=0.3)
    ax.legend()
    lr = [(r["step"], r["lr"]) for r in rows if r.get("lr") is not None]
    if lr:
        ax_lr.plot(*zip(*lr, strict=True), color="C2")
    ax_lr.set(xlabel="step", ylabel="lr")
    ax_lr.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax_lr.grid(alpha=0.3)
    return fig


def training_section(stage: Stage, plots: Path) -> str:
    """Loss curve, throughput, the run summary and the data counts (truncation is never silent)."""
    rows, bad = read_metrics(stage.folder / "metrics.jsonl")
    summary = _read_json(stage.folder / f"{stage.kind}.json") or {}
    parts = [_box(bad)]
    if rows:
        name = stage.folder.name
        parts.append(_embed(loss_figure(rows, name), plots / f"{name}-loss.png", f"{name} loss"))
        tps = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
        if tps:
            mean = sum(tps) / len(tps)
            parts.append(f"<p>Throughput: {mean:,.0f} tokens/s on average, {tps[-1]:,.0f} at the end.</p>")
    else:
        parts.append("<p>No metrics logged.</p>")
    keys = ("steps", "final_loss", "eval_loss", "parameters", "tokens", "seconds")
    shown = {k: summary[k] for k in keys if summary.get(k) is not None}
    parts.append(_table([[k, _number(v)] for k, v in shown.items()], caption="summary"))
    counts = [[f"data: {k}", v] for k, v in (summary.get("data") or {}).items()]
    if "skipped_rows" in summary:  # sft only; an explicit 0 so a clean file is visibly clean
        counts += [[f"skipped rows: {f}", n] for f, n in (summary["skipped_rows"] or {}).items()]
        counts += [] if summary["skipped_rows"] else [["skipped rows", 0]]
    loud = ("data: truncated", "data: dropped", "skipped")
    flagged = {i for i, (k, v) in enumerate(counts) if v and k.startswith(loud)}
    return "".join(parts) + _table(counts, flagged=flagged, caption="data (highlighted: rows lost or cut)")
