"""The section of a supervised training stage (pretrain, sft): loss curve, throughput, data counts,
and one example per data source with the tokens the loss trains on marked."""

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
    esc,
    html_table,
    number,
    percent,
    read_json,
    read_metrics,
)
from temper.report.contamination import contamination_html
from temper.train import overfitting

# whitespace drawn as visible marks inside a token; a newline also breaks the line after the token
_VISIBLE = {" ": "·", "\t": "→", "\n": "↵", "\r": "␍"}
LEGEND = (
    '<p>Legend: <span class="toks"><span class="sup">supervised</span></span> a token the loss trains '
    'on; <span class="toks"><span>context</span></span> one it does not; '
    '<span class="toks"><span class="sp">&lt;|special|&gt;</span></span> a special token; '
    '<span class="toks"><span class="ws">·</span> <span class="ws">↵</span> <span class="ws">→</span></span> '
    "a space, a newline, a tab. Hover a token for its id.</p>"
)


def loss_figure(rows: list[dict[str, Any]], title: str) -> Figure | None:
    """Train loss (and held-out loss points) over steps, the learning rate in a strip below when
    it was logged; None when no loss was (an empty plot says nothing)."""
    train = [(r["step"], r["loss"]) for r in rows if math.isfinite(r.get("loss", math.nan))]
    held = [(r["step"], r["eval_loss"]) for r in rows if r.get("eval_loss") is not None]
    lr = [(r["step"], r["lr"]) for r in rows if r.get("lr") is not None]
    if not train and not held:
        return None
    fig = Figure(figsize=(7.5, 4.5 if lr else 3.4), layout="constrained")
    ax, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1)) if lr else (fig.subplots(), None)
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
    bottom = ax_lr or ax
    if ax_lr is not None:
        ax_lr.plot(*zip(*lr, strict=True), color="C2")
        ax_lr.set(ylabel="lr")
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        ax_lr.grid(alpha=0.3)
    bottom.set(xlabel="step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def training_section(stage: Stage, plots: Path) -> str:
    """Loss curve, throughput, the run summary and the data counts (truncation is never silent)."""
    rows, bad = read_metrics(stage.folder / "metrics.jsonl")
    summary = read_json(stage.folder / f"{stage.kind}.json") or {}
    parts = [boxes(bad)]
    fig = loss_figure(rows, stage.folder.name) if rows else None
    if fig is not None:
        name = stage.folder.name
        parts.append(embed_figure(fig, plots / f"{name}-loss.png", f"{name} loss"))
        parts.append(overfitting_table(rows))
        tps = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
        if tps:
            mean = sum(tps) / len(tps)
            parts.append(f"<p>Throughput: {mean:,.0f} tokens/s on average, {tps[-1]:,.0f} at the end.</p>")
    else:
        parts.append("<p>No metrics logged.</p>")
    keys = ("steps", "final_loss", "eval_loss", "parameters", "tokens", "seconds")
    shown = {k: summary[k] for k in keys if summary.get(k) is not None}
    parts.append(html_table([[k, number(v)] for k, v in shown.items()], caption="summary"))
    counts = [[f"data: {k}", v] for k, v in (summary.get("data") or {}).items()]
    if "skipped_rows" in summary:  # sft only; an explicit 0 so a clean file is visibly clean
        counts += [[f"skipped rows: {f}", n] for f, n in (summary["skipped_rows"] or {}).items()]
        counts += [] if summary["skipped_rows"] else [["skipped rows", 0]]
    loud = ("data: truncated", "data: dropped", "skipped")
    flagged = {i for i, (k, v) in enumerate(counts) if v and k.startswith(loud)}
    parts.append(html_table(counts, flagged=flagged, caption="data (highlighted: rows lost or cut)"))
    parts.append(mix_table(summary.get("mix") or {}))
    parts.append(best_of_n_table(summary.get("best_of_n") or {}))
    parts.append(contamination_html(summary.get("contamination")))
    return "".join(parts) + mask_section(stage.folder / "examples.json")


def overfitting_table(rows: list[dict[str, Any]]) -> str:
    """The overfitting check (`temper.train.overfitting`) shown as the RL section shows its
    monitors: the latest value, the step it first flagged, and its rule, highlighted once it has
    flagged (and a warning box while it flags). Nothing for a run without held-out evaluations, a
    note for one with too few to tell."""
    held = [r for r in rows if any(r.get(k) is not None for k in overfitting.HELD_OUT_KEYS)]
    if not held:
        return ""
    found, first = overfitting.check(rows), overfitting.first_flagged(rows)
    if found is None:
        value = (
            f"{len(held)} held-out evaluation(s); the check needs {overfitting.MIN_EVALS} (train.eval_every)"
        )
        flagged = "–"
    else:
        value = (
            f"{found.last:.3g} at step {found.last_step}, lowest {found.best:.3g} at step {found.best_step} "
            f"({found.rise:+.1%}); train loss {found.train_at_best:.3g} -> {found.train_last:.3g}"
        )
        flagged = (
            "no"
            if first is None
            else f"step {first}" + ("" if found.flagged else " (not at the last evaluation)")
        )
    rule = (
        f"flags when the latest held-out loss is at least {overfitting.RISE:.0%} above its lowest earlier "
        f"value while the train loss (mean of the last {overfitting.SMOOTH} logged) fell since that step: "
        "the model memorizes its training rows. Fewer steps, more data or an earlier checkpoint (a select "
        "stage) should generalize better"
    )
    warn = [found.describe()] if found is not None and found.flagged else []
    head = ["check", "current value", "flagged", "what it means"]
    table = html_table(
        [["held-out loss rising", value, flagged, rule]], head, {0} if first is not None else set()
    )
    return "<h3>Overfitting check</h3>" + boxes(warn) + table


def mix_table(mix: dict[str, Any]) -> str:
    """A pretrain stage's `corpus.mix`: each source's stated and realised token share, its tokens
    and how often it was read through (a source read again is highlighted: it repeats); "" without one."""
    if not mix:
        return ""
    head = ["source", "share", "realised share", "tokens", "examples", "passes"]
    rows = [
        [
            name,
            percent(m["share"]),
            f"{100 * m['realised_share']:.1f}%",
            number(m["tokens"]),
            number(m["examples"]),
            m["passes"],
        ]
        for name, m in mix.items()
    ]
    flagged = {i for i, m in enumerate(mix.values()) if m["passes"] > 1}
    return html_table(rows, head, flagged, caption="corpus mix (highlighted: a source read more than once)")


def best_of_n_table(by_task: dict[str, Any]) -> str:
    """The sft stage's best-of-N rows per task (`data.best_of_n`): the yield, why prompts gave no
    row, and how often the verifier accepts all samples and the kept ones; "" without any."""
    head = ["task", "prompts", "samples each", "rows", "yield", "no row", "sample accuracy", "kept correct"]
    rows = [
        [
            task,
            c["prompts"],
            c["samples_per_prompt"],
            c["rows"],
            percent(c["yield"]),
            ", ".join(f"{k}: {v}" for k, v in c["no_row"].items()) or "–",
            percent(c["sample_accuracy"]),
            percent(c["kept_correct"]),
        ]
        for task, c in by_task.items()
    ]
    return html_table(rows, head, caption="best-of-N rows (sampled from the starting model, top-ranked kept)")


def _token(piece: str, token_id: int, special: bool, supervised: bool) -> str:
    """One token as a span: its text escaped, whitespace made visible; an empty piece is part of a
    character that the next token completes."""
    text = (
        "".join(f'<span class="ws">{_VISIBLE[c]}</span>' if c in _VISIBLE else esc(c) for c in piece)
        or '<span class="ws">▯</span>'
    )
    cls = " ".join(c for c, on in (("sup", supervised), ("sp", special)) if on)
    title = f"id {token_id}{' (special)' if special else ''}: {'supervised' if supervised else 'not trained'}"
    attrs = f' class="{cls}"' if cls else ""
    # the line break goes after the span: inside it would split the token's box over two lines
    return f'<span{attrs} title="{esc(title)}">{text}</span>' + "\n" * piece.count("\n")


def mask_example(view: dict[str, Any]) -> str:
    """One example from examples.json (`temper.data.mask_view`): a caption, warnings for a mask
    that cannot teach the model to answer or to stop, and the tokens."""
    pieces, mask, special, ids = view["pieces"], view["mask"], view["special"], view["ids"]
    n_sup = sum(mask)
    where = f"{view['source']}, row {view['line']}"
    said = f"{where}: {len(ids)} tokens, {n_sup} supervised" + (
        " (truncated at max_len)" if view.get("truncated") else ""
    )
    warn = []
    if not n_sup:
        warn.append(f"{where}: no token is supervised; this example teaches nothing")
    eos = view.get("eos_token")
    if (
        n_sup
        and eos
        and not view.get("truncated")
        and not any(p == eos and m for p, m in zip(pieces, mask, strict=True))
    ):
        warn.append(
            f"{where}: the tokenizer's eos_token {eos!r} is not among the supervised tokens, so the model "
            "does not learn to end its answer with it; generation that stops only at eos may not stop"
        )
    spans = "".join(_token(*t) for t in zip(pieces, ids, special, mask, strict=True))
    return f"<p>{esc(said)}</p>{boxes(warn)}<div class='toks'>{spans}</div>"


def mask_section(path: Path) -> str:
    """The examples of a stage's examples.json under a legend; nothing when the stage wrote none."""
    views = (read_json(path) or {}).get("examples") or []
    if not views:
        return ""
    return (
        "<h3>Training examples as the loss sees them</h3><p>The first example of each data source, "
        "token by token.</p>" + LEGEND + "".join(mask_example(v) for v in views)
    )
