"""The RL stage's section: format gate and reachability probe, training curves, compute, rollouts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from temper.report.common import (
    Stage,
    _box,
    _duration,
    _embed,
    _esc,
    _mark,
    _number,
    _pct,
    _read_json,
    _table,
    read_metrics,
)
from temper.rewards.diagnostics import CAUSES, NO_SIGNAL_SHARE, NO_SIGNAL_WARNING, advice


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
        if zero >= NO_SIGNAL_SHARE:
            parts.append(_box([NO_SIGNAL_WARNING]))
        big = {i for i, v in enumerate(causes.values()) if v >= 0.25}
        rows = [[c, _pct(v), advice(c)] for c, v in causes.items()]
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
