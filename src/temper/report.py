"""An HTML report of a run folder: the page a user opens after a run instead of reading logs.

Everything is read back from what the stages left on disk (stage.json, metrics.jsonl, the stage
summaries, eval.json), so the report can be rebuilt for any run, finished or not. One function
renders each section; `SECTIONS` picks it by stage kind, so a new kind adds one entry and touches
nothing else. Plots are PNG files under plots/ and are also inlined as data URIs, so
report.html is one portable file with no scripts and no network.

Plots use `matplotlib.figure.Figure` directly rather than pyplot: it renders with Agg without
`matplotlib.use`, so importing this module never switches the backend of the caller's process
(a notebook's, say), and figures need no `plt.close` to be freed.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from temper.atomic import atomic_write_text
from temper.evaluate import table_rows
from temper.rewards.diagnostics import CAUSES

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.1em; } h2 { border-bottom: 1px solid #ddd; margin-top: 2em; } small { color: #777; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 14px; }
caption { text-align: left; color: #555; font-size: 13px; padding-bottom: 0.2em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; } th { background: #f4f4f4; }
td { font-variant-numeric: tabular-nums; }
.warn { background: #fff4e0; } .bad { color: #b00; } .good { color: #070; }
.box { background: #fff4e0; border-left: 4px solid #e90; padding: 0.4em 0.8em; margin: 0.8em 0; }
img { max-width: 100%; display: block; margin: 0.8em 0; }
pre { background: #f7f7f7; padding: 0.5em; white-space: pre-wrap; word-break: break-word; margin: 0.3em 0; }
details { margin: 0.4em 0; } summary { cursor: pointer; } .ex { border-top: 1px solid #eee; padding: 0.4em 0; }
"""


@dataclass(frozen=True)
class Stage:
    folder: Path
    kind: str
    seconds: float | None  # None until stage.json marks the stage complete


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _read_json(path: Path) -> Any:
    """The parsed file, or None when it does not exist; a broken file is an error naming it."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m {s:02d}s" if m < 60 else f"{m // 60}h {m % 60:02d}m"


def _guess_kind(folder: Path) -> str:
    """The kind of a stage that never wrote stage.json, from what it left ("training": a curve so far)."""
    for name, kind in (
        ("eval.json", "eval"),
        ("pretrain.json", "pretrain"),
        ("sft.json", "sft"),
        ("rl.json", "rl"),
        ("probe.json", "rl"),  # written before the first RL step
        ("rollouts.jsonl", "rl"),
    ):
        if (folder / name).exists():
            return kind
    return "training" if (folder / "metrics.jsonl").exists() else "?"


def find_stages(run_dir: Path) -> list[Stage]:
    """The stage folders NN-name in NN order; one without a readable stage.json is incomplete."""
    folders = [p for p in run_dir.iterdir() if p.is_dir() and re.match(r"\d+-", p.name)]
    stages = []
    for folder in sorted(folders, key=lambda p: (int(p.name.split("-")[0]), p.name)):
        try:
            info = _read_json(folder / "stage.json") or {}
        except ValueError:
            info = {}
        seconds = info.get("seconds")
        kind = info.get("kind") or _guess_kind(folder)
        stages.append(Stage(folder, kind, float(seconds) if seconds is not None else None))
    return stages


def read_metrics(path: Path, what: str = "metrics row") -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a metrics.jsonl (or any JSONL of rows with a "step") and one message per line
    that is not such a row.

    MetricsLog appends without a rename, so a killed run can leave a torn last line; the page names
    the file and line instead of losing the whole report to it."""
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    if not path.exists():
        return rows, bad
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
        else:
            bad.append(f"{path}:{i}: not a {what}, skipped: {line[:80]!r}")
    return rows, bad


def _box(messages: list[str]) -> str:
    return "".join(f'<div class="box">{_esc(m)}</div>' for m in messages)


def _embed(fig: Figure, png: Path, alt: str) -> str:
    """Write the figure to `png` and return an <img> carrying the same bytes as a data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    png.write_bytes(buf.getvalue())
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _table(
    rows: list[list[Any]],
    head: Sequence[str] = (),
    flagged: AbstractSet[int] = frozenset(),
    caption: str = "",
) -> str:
    """A table of plain-text (escaped) cells; rows whose index is in `flagged` are highlighted."""
    th = "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr>" if head else ""
    tds = ["".join(f"<td>{_esc(c)}</td>" for c in row) for row in rows]
    trs = "".join(
        f"<tr class='warn'>{t}</tr>" if i in flagged else f"<tr>{t}</tr>" for i, t in enumerate(tds)
    )
    cap = f"<caption>{_esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}{th}{trs}</table>" if rows else ""


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


def _number(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def eval_table(by_model: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per model stage × split, splits of a model adjacent (ID test beside OOD); columns and
    cells from `temper.evaluate.table_rows`, as in the CLI. Rows with verifier errors are highlighted."""
    head, rows = table_rows(by_model)
    results = [r for by_split in by_model.values() for r in by_split.values()]
    return _table(rows, head, {i for i, r in enumerate(results) if r.get("verifier_errors")})


def highlights(by_model: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, bool]]:
    """(sentence, is_gain) for each later stage whose greedy accuracy differs from an earlier
    stage's on the same split with non-overlapping 95% intervals; models are in stage order."""
    models, out = list(by_model), []
    for j, later in enumerate(models):
        for earlier in models[:j]:
            for split, r in by_model[later].items():
                if split not in by_model[earlier]:
                    continue
                b = r["metrics"]["greedy_accuracy"]
                a = by_model[earlier][split]["metrics"]["greedy_accuracy"]
                nums = f"{100 * b['value']:.1f}% vs {100 * a['value']:.1f}%"
                if b["lo"] > a["hi"]:
                    out.append((f"{later} > {earlier} on {split}: {nums}", True))
                elif b["hi"] < a["lo"]:
                    out.append((f"{later} < {earlier} on {split}: {nums}", False))
    return out


def accuracy_figure(task: str, by_model: Mapping[str, Mapping[str, Any]]) -> Figure:
    """Greedy accuracy with 95% error bars: a group per model stage, a bar per split."""
    models = list(by_model)
    splits = list(dict.fromkeys(s for by_split in by_model.values() for s in by_split))
    fig = Figure(figsize=(1.6 + 1.4 * len(models) * max(1, len(splits)) / 2, 3.6), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, len(splits))
    for i, split in enumerate(splits):
        xs = [x for x, m in enumerate(models) if split in by_model[m]]
        ms = [by_model[models[x]][split]["metrics"]["greedy_accuracy"] for x in xs]
        lo = [max(0.0, 100 * (m["value"] - m["lo"])) for m in ms]  # max(): rounding must not flip a bar
        hi = [max(0.0, 100 * (m["hi"] - m["value"])) for m in ms]
        shift = (i - (len(splits) - 1) / 2) * width
        ax.bar(
            [x + shift for x in xs],
            [100 * m["value"] for m in ms],
            width,
            yerr=[lo, hi],
            capsize=4,
            label=split,
        )
    ax.set_xticks(range(len(models)), models)
    ax.set(title=task, ylabel="greedy accuracy %", ylim=(0, 100))
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return fig


def _mark(correct: Any) -> str:
    return '<b class="good">correct</b>' if correct else '<b class="bad">wrong</b>'


def _example(e: Mapping[str, Any]) -> str:
    s = e.get("score", {})
    mark = _mark(s.get("correct"))
    meta = [f"parsed: {s.get('parsed')}", f"reason: {s.get('reason')}", f"answer: {s.get('answer')}"]
    meta.append(f"stop: {e.get('stop_reason')}")
    meta += [f"error: {s['error']}"] if s.get("error") else []  # the verifier's exception
    return (
        f'<div class="ex">{_esc(e.get("id", ""))} {mark} <small>{_esc(" · ".join(meta))}</small>'
        f"<pre>{_esc(e.get('prompt', ''))}</pre><pre>{_esc(e.get('completion', ''))}</pre></div>"
    )


def samples(task: str, by_model: Mapping[str, Mapping[str, Any]]) -> str:
    """A collapsed block of greedy completions per model × split, with the grading reasons."""
    out = []
    for model, by_split in by_model.items():
        for split, r in by_split.items():
            exs = r.get("examples", [])
            reasons = ", ".join(f"{k}: {v}" for k, v in r.get("reasons", {}).items())
            n_ok = sum(bool(e.get("score", {}).get("correct")) for e in exs)
            title = f"{task} / {model} / {split}: {len(exs)} examples, {n_ok} correct"
            out.append(
                f"<details><summary>{_esc(title)}</summary>"
                f"<p>Grading reasons over all {r['n_problems']} problems: {_esc(reasons)}</p>"
                f"{''.join(_example(e) for e in exs)}</details>"
            )
    return "".join(out)


def eval_section(stage: Stage, plots: Path) -> str:
    """Per task: the wins and regressions in words, the table, the bar chart and sample completions."""
    results = _read_json(stage.folder / "eval.json") or {}
    parts = [] if results else ["<p>No eval results.</p>"]
    for task, by_model in results.items():
        parts.append(f"<h3>{_esc(task)}</h3>")
        if not by_model:
            parts.append("<p>No models evaluated.</p>")
            continue
        said = "".join(
            f"<li class='{'good' if up else 'bad'}'>{_esc(s)}</li>" for s, up in highlights(by_model)
        )
        parts.append(
            f"<ul>{said}</ul>" if said else "<p>No difference with non-overlapping 95% intervals.</p>"
        )
        parts.append(eval_table(by_model))
        png = plots / f"{stage.folder.name}-{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.png"
        parts.append(_embed(accuracy_figure(task, by_model), png, f"{task} greedy accuracy"))
        parts.append(samples(task, by_model))
    return "".join(parts)


HINTS = {  # zero-variance cause -> what it means and what to do (see temper.rewards.diagnostics)
    "all_correct": "every sample already right: too easy to learn from; use harder problems",
    "all_wrong": "no sample right: too hard for this policy; more SFT, easier problems or a larger group",
    "parse_failure": "no answer could be parsed: the format is not learned; SFT first, or a format reward",
    "truncated": "every sample hit max_new_tokens: raise max_new_tokens",
    "verifier_error": "the grader failed: check the task's verifier",
    "equal_other": "parsed but equal partial rewards: check the reward components",
}


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def _causes(d: Mapping[str, Any]) -> dict[str, float]:
    """{cause: share of groups} for the causes present, largest first."""
    found = {k.split("/", 1)[1]: v for k, v in d.items() if k.startswith("zero_variance/") and v}
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def gate_and_probe(gate: Mapping[str, Any] | None, probe: Mapping[str, Any] | None) -> str:
    """The format gate per task and the reachability probe: how many groups carry no signal, and why."""
    parts = []
    if gate:
        rates = {k.removesuffix("/parse_rate"): v for k, v in (gate.get("parse_rates") or {}).items()}
        low = {i for i, v in enumerate(rates.values()) if v < gate.get("threshold", 0)}
        verdict = (
            "passed" if gate.get("passed") else "<b class='bad'>failed</b> (on_fail: warn, RL ran anyway)"
        )
        parts.append(
            f"<p>Format gate {verdict}: greedy parse rate on held-out prompts, threshold "
            f"{_pct(gate.get('threshold', 0))}.</p>"
        )
        parts.append(_table([[t, _pct(v)] for t, v in rates.items()], ["task", "parse rate"], low))
    if probe:
        causes = _causes(probe)
        zero = probe.get("zero_variance", 0.0)
        said = f"{_pct(zero)} of {probe.get('groups', '?')} groups had zero reward variance"
        said += ": " + ", ".join(f"{c} {_pct(v)}" for c, v in causes.items()) if causes else ""
        start = f"accuracy {_pct(probe['accuracy'])}, " if "accuracy" in probe else ""
        start += f"parse rate {_pct(probe['parse_rate'])}" if "parse_rate" in probe else ""
        parts.append(
            f"<p>Reachability probe (starting policy, {probe.get('group_size', '?')} samples per "
            f"group{', ' + start if start else ''}): {_esc(said)}.</p>"
        )
        if zero >= 0.9:
            parts.append(_box(["Almost no group carries a learning signal: RL is unlikely to move."]))
        big = {i for i, v in enumerate(causes.values()) if v >= 0.25}
        rows = [[c, _pct(v), HINTS.get(c, "")] for c, v in causes.items()]
        parts.append(
            _table(
                rows, ["no signal because", "groups", "meaning"], big, "highlighted: 25% of groups or more"
            )
        )
    return "".join(parts)


def _plot(ax: Any, rows: list[dict[str, Any]], key: str, *args: Any, **kw: Any) -> bool:
    """Plot `key` over steps where it is a finite number; False when no row has it."""
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float) and math.isfinite(r[key])]
    if len(pts) == 1:  # a line of one point draws nothing
        kw.setdefault("marker", "o")
    if pts:
        ax.plot(*zip(*pts), *args, **kw)
    return bool(pts)


def rl_figure(rows: list[dict[str, Any]], title: str) -> Figure:
    """Six panels over steps: reward, accuracy/parse rate (+ evals), zero-variance by cause, KL and
    entropy, response length and truncation, clip fraction. One figure: one render, one PNG."""
    fig = Figure(figsize=(11, 9), layout="constrained")
    fig.suptitle(title)
    axes = fig.subplots(3, 2, sharex=True)
    (rew, acc), (zv, kl), (length, clip) = axes
    keys = list(dict.fromkeys(k for r in rows for k in r))
    _plot(rew, rows, "reward", label="reward", lw=2, color="k")
    for k in (k for k in keys if k.startswith("reward/")):
        _plot(rew, rows, k, "--", label=k.split("/", 1)[1])
    rew.set(ylabel="mean reward")
    _plot(acc, rows, "accuracy", label="accuracy")
    _plot(acc, rows, "parse_rate", label="parse rate")
    tasks = list(dict.fromkeys(k.split("/")[1] for k in keys if k.startswith("eval/")))
    for i, task in enumerate(tasks):  # greedy held-out evals: colour of the metric, a marker per task
        for what, color, face in (("accuracy", "C0", None), ("parse_rate", "C1", "none")):
            _plot(
                acc,
                rows,
                f"eval/{task}/{what}",
                "osD^v"[i % 5],
                color=color,
                mfc=face,
                label=f"eval {task} {what}",
            )
    acc.set(ylabel="share of samples", ylim=(-0.03, 1.03))
    order = {c: i for i, c in enumerate(CAUSES)}  # a cause keeps its colour across runs
    causes = sorted({c for r in rows for c in _causes(r)}, key=lambda c: order.get(c, len(CAUSES)))
    pts = [r for r in rows if "zero_variance" in r]
    if causes and pts:
        zv.stackplot(
            [r["step"] for r in pts],
            *[[r.get(f"zero_variance/{c}") or 0 for r in pts] for c in causes],
            labels=causes,
            colors=[f"C{order.get(c, 9)}" for c in causes],
            alpha=0.8,
        )
    _plot(zv, rows, "zero_variance", color="k", lw=1, label="total")
    zv.set(ylabel="zero-variance groups", ylim=(0, 1.03))
    _plot(kl, rows, "kl", label="kl (k3 loss term)")
    _plot(kl, rows, "kl_ref", label="kl to reference (k1)")
    ent = kl.twinx()
    if _plot(ent, rows, "entropy", color="C3", label="entropy"):
        ent.set_ylabel("entropy (nats)", color="C3")
    kl.set(ylabel="KL")
    _plot(length, rows, "response_length", label="response length")
    length.set(ylabel="tokens", xlabel="step")
    trunc = length.twinx()
    if _plot(trunc, rows, "truncation_rate", color="C3", label="truncation rate"):
        trunc.set_ylabel("truncation rate", color="C3")
        trunc.set_ylim(-0.03, 1.03)
    _plot(clip, rows, "clip_frac", label="policy clip fraction")
    _plot(clip, rows, "value_clip_frac", label="value clip fraction")
    clip.set(ylabel="clipped share", xlabel="step")
    for ax, twin in ((rew, None), (acc, None), (zv, None), (kl, ent), (length, trunc), (clip, None)):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        handles = [h for a in (ax, twin) if a is not None for h in a.get_legend_handles_labels()[0]]
        if handles:
            ax.legend(handles=handles, fontsize=8)
    return fig


def rl_compute(summary: Mapping[str, Any], rows: list[dict[str, Any]]) -> str:
    """Steps, time, tokens, and where a step's time goes (sampling vs preparing vs training)."""
    table = [["steps", summary.get("steps", rows[-1]["step"] if rows else "–")]]
    table.append(["wall time", _duration(summary.get("seconds"))])
    table += [
        [k.replace("_", " "), _number(summary[k])]
        for k in ("sampled_tokens", "trained_tokens")
        if k in summary
    ]

    def mean(key: str) -> float | None:
        vs = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        return sum(vs) / len(vs) if vs else None

    phases = {p: mean(f"time/{p}") for p in ("sample", "prepare", "train")}
    total = sum(v for v in phases.values() if v is not None)
    for p, v in phases.items():
        if v is not None:
            table.append([f"mean time/{p} per step", f"{v:.3g}s ({_pct(v / total) if total else '–'})"])
    for key in ("rollout_tokens_per_s", "train_tokens_per_s"):
        if (v := mean(key)) is not None:
            table.append([f"mean {key.replace('_per_s', '/s').replace('_', ' ')}", f"{v:,.0f}"])
    if (v := mean("sampling_rounds")) is not None and v > 1:  # dynamic sampling redrew groups
        table.append(["mean sampling rounds per step", f"{v:.2f}"])
    return _table(table, caption="compute")


def _rollout(r: Mapping[str, Any]) -> str:
    parts = ", ".join(f"{k} {_number(v)}" for k, v in (r.get("parts") or {}).items())
    reward = _number(r["reward"]) if isinstance(r.get("reward"), int | float) else r.get("reward")
    meta = [f"reward {reward}", f"parts: {parts}", f"parsed: {r.get('parsed')}", f"reason: {r.get('reason')}"]
    meta.append(f"stop: {r.get('stop')}")
    completion = _esc(r.get("completion", ""))
    return (
        f"<div>{_mark(r.get('correct'))} <small>{_esc(' · '.join(meta))}</small><pre>{completion}</pre></div>"
    )


def rollout_samples(path: Path) -> str:
    """The first and the last logged step's rollouts, collapsed, grouped by problem (prompt shown once)."""
    records, bad = read_metrics(path, "rollout row")
    by_step: dict[Any, list[dict[str, Any]]] = {}
    prev = None
    for r in records:  # a resumed run logs its replayed steps again: a step keeps its latest rows
        if r["step"] != prev:
            by_step[r["step"]] = []
            prev = r["step"]
        by_step[r["step"]].append(r)
    if not by_step:
        return _box(bad) + "<p>No rollouts logged.</p>"
    steps = sorted(by_step)
    out = [_box(bad)]
    for which, step in [("first", steps[0])] + [("last", steps[-1])] * (len(steps) > 1):
        rs = by_step[step]
        mean = sum(r.get("reward") or 0 for r in rs) / len(rs)
        n_ok = sum(bool(r.get("correct")) for r in rs)
        title = f"step {step} ({which} logged): {len(rs)} rollouts, {n_ok} correct, mean reward {mean:.3g}"
        problems: dict[Any, list[dict[str, Any]]] = {}
        for r in rs:
            problems.setdefault(r.get("problem"), []).append(r)
        body = "".join(
            f'<div class="ex">{_esc(p)}<pre>{_esc(g[0].get("prompt", ""))}</pre>{"".join(map(_rollout, g))}</div>'
            for p, g in problems.items()
        )
        out.append(f"<details><summary>{_esc(title)}</summary>{body}</details>")
    return "".join(out)


def rl_section(stage: Stage, plots: Path) -> str:
    """Gate and probe, the training curves, compute, and sample rollouts from the first and last step."""
    rows, bad = read_metrics(stage.folder / "metrics.jsonl")
    summary = _read_json(stage.folder / "rl.json") or {}
    pre = _read_json(stage.folder / "probe.json") or {}  # there before step 1: an unfinished stage has it
    parts = [
        _box(bad),
        gate_and_probe(summary.get("gate") or pre.get("gate"), summary.get("probe") or pre.get("probe")),
    ]
    if rows:
        name = stage.folder.name
        parts.append(_embed(rl_figure(rows, name), plots / f"{name}-curves.png", f"{name} RL curves"))
    else:
        parts.append("<p>No metrics logged.</p>")
    parts.append(rl_compute(summary, rows))
    parts.append(rollout_samples(stage.folder / "rollouts.jsonl"))
    return "".join(parts)


def unknown_section(stage: Stage, plots: Path) -> str:
    files = ", ".join(sorted(p.name for p in stage.folder.iterdir() if not p.name.startswith(".")))
    return f"<p>No report section for stage kind '{_esc(stage.kind)}'. Files: {_esc(files) or 'none'}.</p>"


Section = Callable[[Stage, Path], str]
SECTIONS: dict[str, Section] = {
    "pretrain": training_section,
    "sft": training_section,
    "training": training_section,  # a training stage that stopped before stage.json: its curve so far
    "eval": eval_section,
    "rl": rl_section,
}


def header(run_dir: Path, stages: list[Stage]) -> str:
    """Run name, when the page was written, total time and a row per stage (incomplete ones flagged)."""
    total = sum(s.seconds for s in stages if s.seconds is not None)
    open_ = {i for i, s in enumerate(stages) if s.seconds is None}
    rows = [
        [s.folder.name, s.kind, _duration(s.seconds), "incomplete" if i in open_ else "complete"]
        for i, s in enumerate(stages)
    ]
    table = _table(rows, ["stage", "kind", "time", "status"], open_)
    recipe = run_dir / "recipe.yaml"
    if recipe.exists():
        table += f"<details><summary>recipe.yaml</summary><pre>{_esc(recipe.read_text())}</pre></details>"
    written = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"<h1>{_esc(run_dir.name)}</h1><p><small>report written {written} · total stage time {_duration(total)}"
        f" · {_esc(run_dir.resolve())}</small></p>{table or '<p>No stages yet.</p>'}"
    )


def _section(stage: Stage, plots: Path) -> str:
    """One stage's section; a missing or unreadable file becomes a note instead of no report at all."""
    try:
        return SECTIONS.get(stage.kind, unknown_section)(stage, plots)
    except (OSError, ValueError) as e:
        return _box([f"could not read this stage's outputs: {e}"])


def write_report(run_dir: Path) -> Path:
    """Write `run_dir/report.html` (and its plots under `run_dir/plots/`) and return its path."""
    run_dir = Path(run_dir)
    plots = run_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    stages = find_stages(run_dir)
    body = [header(run_dir, stages)]
    for s in stages:
        body.append(f"<h2>{_esc(s.folder.name)} <small>{_esc(s.kind)}</small></h2>{_section(s, plots)}")
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(run_dir.name)} · temper</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    out = run_dir / "report.html"
    atomic_write_text(out, page)
    return out
