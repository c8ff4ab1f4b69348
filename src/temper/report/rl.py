"""The RL stage's section: format gate and reachability probe, training curves, compute, rollouts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from temper.report.agent import LEGEND, episode_html, rl_episode_table
from temper.report.common import (
    Stage,
    boxes,
    correct_mark,
    duration,
    embed_figure,
    esc,
    html_table,
    number,
    percent,
    read_json,
    read_metrics,
)
from temper.report.contamination import contamination_html
from temper.rewards import monitors
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
            f"{percent(gate.get('threshold', 0))}.</p>"
        )
        parts.append(html_table([[t, percent(v)] for t, v in rates.items()], ["task", "parse rate"], low))
        parts.append(boxes([gate["message"]] if gate.get("message") else []))
    if probe:
        causes = _causes(probe)
        zero = probe.get("zero_variance", 0.0)
        said = f"{percent(zero)} of {probe.get('groups', '?')} groups had zero reward variance"
        said += ": " + ", ".join(f"{c} {percent(v)}" for c, v in causes.items()) if causes else ""
        start = f"accuracy {percent(probe['accuracy'])}, " if "accuracy" in probe else ""
        start += f"parse rate {percent(probe['parse_rate'])}" if "parse_rate" in probe else ""
        parts.append(
            f"<p>Reachability probe (starting policy, {probe.get('group_size', '?')} samples per "
            f"group{', ' + start if start else ''}): {esc(said)}.</p>"
        )
        if zero >= NO_SIGNAL_SHARE:
            parts.append(boxes([NO_SIGNAL_WARNING]))
        big = {i for i, v in enumerate(causes.values()) if v >= 0.25}
        rows = [[c, percent(v), advice(c)] for c, v in causes.items()]
        parts.append(
            html_table(
                rows, ["no signal because", "groups", "meaning"], big, "highlighted: 25% of groups or more"
            )
        )
    return "".join(parts)


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[Any, float]]:
    """(step, value) where `key` is a finite number."""
    return [
        (r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]


def _plot(ax: Any, rows: list[dict[str, Any]], key: str, *args: Any, **kw: Any) -> bool:
    """Plot `key` over steps where it is a finite number; False when no row has it."""
    pts = _points(rows, key)
    if len(pts) == 1:  # a line of one point draws nothing
        kw.setdefault("marker", "o")
    if pts:
        ax.plot(*zip(*pts), *args, **kw)
    return bool(pts)


def _twin(ax: Any, rows: list[dict[str, Any]], key: str, label: str, ylabel: str) -> Any:
    """`key` in red on a right-hand axis beside `ax`'s series, or on `ax` itself when `ax` has
    none (a panel whose main series was not logged); returns the axis drawn on."""
    if ax.lines:
        twin = ax.twinx()
        _plot(twin, rows, key, color="C3", label=label)
        twin.set_ylabel(ylabel, color="C3")
        return twin
    _plot(ax, rows, key, color="C3", label=label)
    ax.set_ylabel(ylabel)
    return ax


def _reward(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    _plot(ax, rows, "reward", label="reward", lw=2, color="k")
    for k in (k for k in keys if k.startswith("reward/")):
        _plot(ax, rows, k, "--", label=k.split("/", 1)[1])
    # RLVP: the raw path score beside the outcome (its z-score, what the reward adds, averages 0)
    _plot(ax, rows, "path/phi", "-.", color="C3", label="path Phi (raw)")
    ax.set(ylabel="mean reward")


def _accuracy(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    _plot(ax, rows, "accuracy", label="accuracy")
    _plot(ax, rows, "parse_rate", label="parse rate")
    tasks = list(dict.fromkeys(k.split("/")[1] for k in keys if k.startswith("eval/")))
    for i, task in enumerate(tasks):  # greedy held-out evals: colour of the metric, a marker per task
        for what, color, face in (("accuracy", "C0", None), ("parse_rate", "C1", "none")):
            _plot(
                ax,
                rows,
                f"eval/{task}/{what}",
                "osD^v"[i % 5],
                color=color,
                mfc=face,
                label=f"eval {task} {what}",
            )
    ax.set(ylabel="share of samples", ylim=(-0.03, 1.03))


def _zero_variance(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    order = {c: i for i, c in enumerate(CAUSES)}  # a cause keeps its colour across runs
    causes = sorted({c for r in rows for c in _causes(r)}, key=lambda c: order.get(c, len(CAUSES)))
    pts = [r for r in rows if "zero_variance" in r]
    if causes and pts:
        ax.stackplot(
            [r["step"] for r in pts],
            *[[r.get(f"zero_variance/{c}") or 0 for r in pts] for c in causes],
            labels=causes,
            colors=[f"C{order.get(c, 9)}" for c in causes],
            alpha=0.8,
        )
    _plot(ax, rows, "zero_variance", color="k", lw=1, label="total")
    ax.set(ylabel="zero-variance groups", ylim=(0, 1.03))


def _kl_entropy(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    _plot(ax, rows, "kl", label="kl (k3 loss term)")
    _plot(ax, rows, "kl_ref", label="kl to reference (k1)")
    if ax.lines:
        ax.set(ylabel="KL")
    return _twin(ax, rows, "entropy", "entropy", "entropy (nats)") if _points(rows, "entropy") else None


def _length(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    _plot(ax, rows, "response_length", label="response length")
    if ax.lines:
        ax.set(ylabel="tokens")
    if not _points(rows, "truncation_rate"):
        return None
    twin = _twin(ax, rows, "truncation_rate", "truncation rate", "truncation rate")
    twin.set_ylim(-0.03, 1.03)
    return twin


def _clip(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    _plot(ax, rows, "clip_frac", label="policy clip fraction")
    _plot(ax, rows, "value_clip_frac", label="value clip fraction")
    ax.set(ylabel="clipped share")


def _path(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    """RLVP: violations per episode (total, and per rule dashed) against compliance rate and
    success (accuracy) on a 0-1 axis on the right: fewer violations at equal success is the aim."""
    _plot(ax, rows, "path/violations", color="C3", lw=2, label="violations / episode")
    per = [k for k in keys if k.startswith("path/violations/")]
    for i, k in enumerate(per if len(per) > 1 else []):  # one signal: its line is the total's
        _plot(ax, rows, k, "--", color=f"C{(i + 4) % 10}", label=k.removeprefix("path/violations/"))
    if ax.lines:
        ax.set(ylabel="violations per episode")
    rates = [k for k in ("path/compliance_rate", "accuracy") if _points(rows, k)]
    if not rates:
        return None
    twin = ax.twinx() if ax.lines else ax
    for k, color in zip(rates, ("C2", "C0"), strict=False):
        _plot(twin, rows, k, ":" if k == "accuracy" else "-", color=color,
              label="success (accuracy)" if k == "accuracy" else "compliance rate")  # fmt: skip
    twin.set(ylabel="share", ylim=(-0.03, 1.03))
    return twin


def _mismatch(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    """Sampler/trainer mismatch (`temper.algorithms.mismatch`): mean and max |log pi_trainer -
    log pi_sampler| per token and the k3 KL estimate on a log axis; on the right, the share of
    tokens past the threshold and, with a correction, the share its weights drop."""
    _plot(ax, rows, "mismatch/max_abs", color="C3", label="max |log-ratio|")
    _plot(ax, rows, "mismatch/mean_abs", color="C0", label="mean |log-ratio|")
    _plot(ax, rows, "mismatch/kl_k3", "--", color="C2", label="KL (k3)")
    if any(v > 0 for line in ax.lines for v in line.get_ydata()):
        ax.set_yscale("log")
    if ax.lines:
        ax.set(ylabel="sampler/trainer mismatch (nats)")
    shares = [k for k in ("mismatch/share_past", "mismatch/dropped") if _points(rows, k)]
    if not shares:
        return None
    twin = ax.twinx() if ax.lines else ax
    for k, style in zip(shares, (":", "-."), strict=False):
        label = "share past threshold" if k.endswith("share_past") else "share dropped (correction)"
        _plot(twin, rows, k, style, color="C4" if k.endswith("share_past") else "C1", label=label)
    twin.set(ylabel="share of tokens", ylim=(-0.03, 1.03))
    return twin


def _pipeline(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    """Asynchronous rollouts (`async_rollouts`): seconds per step the worker sampled, the trainer
    trained and the trainer waited for its batch (overlap shows as the wait falling below the
    sampling time), and on the right the batch's staleness in updates."""
    _plot(ax, rows, "time/sample", color="C0", label="sampling (worker)")
    _plot(ax, rows, "time/train", color="C1", label="training")
    _plot(ax, rows, "async/wait", "--", color="C3", label="trainer waited")
    if ax.lines:
        ax.set(ylabel="seconds per step")
    if not _points(rows, "async/staleness"):
        return None
    twin = ax.twinx() if ax.lines else ax
    _plot(twin, rows, "async/staleness", ":", color="C2", label="staleness (updates)")
    twin.set(
        ylabel="staleness (updates)", ylim=(-0.1, 1.1 * max(r.get("async/staleness", 0) for r in rows) + 0.1)
    )
    return twin


PROXY = "reward/reward_model"  # a learned reward model's mean score (the proxy)


def _proxy_gold(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> Any:
    """A run trained on a learned reward: the proxy (reward model score) against the gold (the
    verifier's reward of the same samples, never trained on at weight 0) on a 0-1 axis on the
    right. Over-optimization shows as the proxy rising while the gold stalls or falls."""
    _plot(ax, rows, PROXY, color="C4", lw=2, label="proxy (reward model)")
    if ax.lines:
        ax.set(ylabel="reward model score")
    if not _points(rows, monitors.GOLD):
        return None
    twin = _twin(ax, rows, monitors.GOLD, "gold (verifier)", "gold reward")
    return twin


# (panel, the metrics it draws: a panel none of whose metrics was logged is left out)
PANELS = (
    (_reward, lambda k: k in ("reward", "path/phi") or k.startswith("reward/")),
    (_accuracy, lambda k: k in ("accuracy", "parse_rate") or k.startswith("eval/")),
    (_zero_variance, lambda k: k == "zero_variance" or k.startswith("zero_variance/")),
    (_kl_entropy, lambda k: k in ("kl", "kl_ref", "entropy")),
    (_length, lambda k: k in ("response_length", "truncation_rate")),
    (_clip, lambda k: k in ("clip_frac", "value_clip_frac")),
    (_path, lambda k: k.startswith("path/violations") or k == "path/compliance_rate"),
    (_proxy_gold, lambda k: k == monitors.GOLD),
    (_mismatch, lambda k: k.startswith("mismatch/")),
    (_pipeline, lambda k: k.startswith("async/")),
)


def proxy_gold_kl_figure(rows: list[dict[str, Any]], title: str) -> Figure | None:
    """Proxy and gold reward against sqrt(KL to the reference) per sequence, the axis of Gao et
    al. 2023 (Scaling laws for reward model overoptimization, fig. 1): the gold peaks and falls
    while the proxy keeps rising when the policy over-optimizes. KL is k1 summed over a sequence,
    averaged over the step's samples (`kl_ref_seq`; a slightly negative estimate counts as 0).
    None unless the run logged the gold and that KL."""
    pts = [
        (math.sqrt(max(r["kl_ref_seq"], 0.0)), r.get(PROXY), r[monitors.GOLD])
        for r in rows
        if all(
            isinstance(r.get(k), int | float) and math.isfinite(r[k]) for k in ("kl_ref_seq", monitors.GOLD)
        )
    ]
    if not pts:
        return None
    fig = Figure(figsize=(6, 3.4), layout="constrained")
    fig.suptitle(title)
    ax = fig.subplots()
    x = [p[0] for p in pts]
    # points, not a line: the KL of successive steps need not grow, and a line joining them in
    # step order would zigzag back and forth across the axis
    proxy = [(a, b) for a, b, _ in pts if isinstance(b, int | float) and math.isfinite(b)]
    if proxy:
        ax.plot(*zip(*proxy), "o", color="C4", ms=4, label="proxy (reward model)")
        ax.set_ylabel("reward model score")
    twin = ax.twinx() if proxy else ax
    twin.plot(x, [p[2] for p in pts], "s", color="C3", ms=4, mfc="none", label="gold (verifier)")
    twin.set_ylabel("gold reward", color="C3")
    ax.set_xlabel("sqrt(KL to reference), nats^0.5 per sequence")
    ax.grid(alpha=0.3)
    handles = [h for a in dict.fromkeys((ax, twin)) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize=8)
    return fig


def rl_figure(rows: list[dict[str, Any]], title: str) -> Figure | None:
    """Up to ten panels over steps, two per row: reward, accuracy/parse rate (+ evals),
    zero-variance by cause, KL and entropy, response length and truncation, clip fraction, path
    signals (RLVP: violations, compliance rate, success; only when path metrics were logged), proxy
    vs gold (a learned reward: reward model score against the verifier's reward), the
    sampler/trainer mismatch (`mismatch/...`), the asynchronous pipeline (`async/...`). A panel
    whose metrics were never logged (KL without a KL term, say) is left out rather than drawn
    empty; None when there is no panel at all. One figure: one render, one PNG."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    logged = [k for k in keys if k != "step" and _points(rows, k)]
    panels = [draw for draw, wants in PANELS if any(wants(k) for k in logged)]
    if not panels:
        return None
    n_rows, n_cols = (len(panels) + 1) // 2, min(2, len(panels))
    fig = Figure(figsize=(11 if n_cols == 2 else 6, 0.6 + 2.8 * n_rows), layout="constrained")
    fig.suptitle(title)
    grid = fig.subplots(n_rows, n_cols, sharex=True, squeeze=False).ravel()
    for ax in grid[len(panels) :]:  # an odd count: the last row has one panel
        fig.delaxes(ax)
    for i, (ax, draw) in enumerate(zip(grid, panels, strict=False)):
        twin = draw(ax, rows, keys)  # a right-hand axis the panel added, if any
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if i + n_cols >= len(panels):  # the lowest panel of its column carries the step axis
            ax.set_xlabel("step")
            ax.xaxis.set_tick_params(labelbottom=True)
        handles = [
            h for a in dict.fromkeys((ax, twin)) if a is not None for h in a.get_legend_handles_labels()[0]
        ]
        if handles:
            ax.legend(handles=handles, fontsize=8)
    return fig


def rl_compute(summary: Mapping[str, Any], rows: list[dict[str, Any]]) -> str:
    """Steps, time, tokens, and where a step's time goes (sampling vs preparing vs training)."""
    table = [["steps", summary.get("steps", rows[-1]["step"] if rows else "–")]]
    table.append(["wall time", duration(summary.get("seconds"))])
    table += [
        [k.replace("_", " "), number(summary[k])]
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
            table.append([f"mean time/{p} per step", f"{v:.3g}s ({percent(v / total) if total else '–'})"])
    for key in ("rollout_tokens_per_s", "train_tokens_per_s"):
        if (v := mean(key)) is not None:
            table.append([f"mean {key.replace('_per_s', '/s').replace('_', ' ')}", f"{v:,.0f}"])
    if (v := mean("sampling_rounds")) is not None and v > 1:  # dynamic sampling redrew groups
        table.append(["mean sampling rounds per step", f"{v:.2f}"])
    return html_table(table, caption="compute")


def monitor_table(rows: list[dict[str, Any]], settings: Mapping[str, Any] | None = None) -> str:
    """The reward-hacking monitors (`temper.rewards.monitors`): each one's latest value, the step
    it first flagged, and what it measures with the run's thresholds (`settings`, rl.json's
    `monitors`; the defaults when the stage has not written it yet). Flagged rows highlighted."""
    found = monitors.summary(rows)
    if not found:
        return ""
    config = monitors.MonitorConfig(**(settings or {}))
    table = [
        [name, "–" if value is None else f"{value:.3g}",
         "no" if first is None else f"step {first}" + ("" if now else " (not at the last step)"),
         monitors.describe(name, config)]
        for name, value, first, now in found
    ]  # fmt: skip
    flagged = {i for i, (_, _, first, _) in enumerate(found) if first is not None}
    note = "gold: greedy held-out eval accuracy when the window holds two evals, else the verifier's accuracy on the training samples"
    return "<h3>Reward-hacking monitors</h3>" + html_table(
        table, ["monitor", "current value", "flagged", "what it means"], flagged, note
    )


def curriculum_table(rows: list[dict[str, Any]]) -> str:
    """A curriculum grown from failures (code_repair's or web_shop's, WebRL-style): the pool at the end, the
    share of it the curriculum generated, what the gate admitted and rejected over the run, and
    the share of the drawn problems that were generated; empty when no curriculum ran."""
    rows = [r for r in rows if "curriculum/pool_size" in r]
    if not rows:
        return ""
    last = rows[-1]
    rejected = {
        k.removeprefix("curriculum/rejected/"): sum(r.get(k, 0) for r in rows)
        for k in dict.fromkeys(k for r in rows for k in r if k.startswith("curriculum/rejected/"))
    }
    drawn = [r["curriculum/drawn_generated_share"] for r in rows if "curriculum/drawn_generated_share" in r]
    table = [
        ["pool at the end", f"{last['curriculum/pool_size']:,}"],
        ["generated share of the pool", percent(last["curriculum/generated_share"])],
        ["variants admitted", f"{sum(r.get('curriculum/admitted', 0) for r in rows):,}"],
        ["rejected by the gate", ", ".join(f"{k} {v:,}" for k, v in rejected.items() if v) or "none"],
        [
            "generated share of the drawn problems (mean over steps)",
            percent(sum(drawn) / len(drawn)) if drawn else "–",
        ],
    ]
    return html_table(
        table, caption="curriculum (train tasks the policy failed, turned into admitted variants)"
    )


def _rollout(r: Mapping[str, Any]) -> str:
    parts = ", ".join(f"{k} {number(v)}" for k, v in (r.get("parts") or {}).items())
    reward = number(r["reward"]) if isinstance(r.get("reward"), int | float) else r.get("reward")
    meta = [f"reward {reward}", f"parts: {parts}", f"parsed: {r.get('parsed')}", f"reason: {r.get('reason')}"]
    meta.append(f"stop: {r.get('stop')}")
    if r.get("episode"):
        meta.append(f"turns: {r.get('turns')}")
        body = episode_html(r["episode"])
    else:
        body = f"<pre>{esc(r.get('completion', ''))}</pre>"
    return f"<div>{correct_mark(r.get('correct'))} <small>{esc(' · '.join(meta))}</small>{body}</div>"


def provenance_line(r: Mapping[str, Any]) -> str:
    """Where a logged step's samples came from (`temper.train.provenance`), or '' for rows
    logged before provenance was recorded."""
    if "policy_version" not in r:
        return ""
    s = r.get("sampler") or {}
    settings = ", ".join(f"{k} {v}" for k, v in s.items() if k != "kind")
    graders = ", ".join(
        g.get("name", "?") + (f" @{g['sha']}" if g.get("sha") else "")
        + (f" fingerprint {g['fingerprint']}" if g.get("fingerprint") else "")
        for g in r.get("graders") or []
    )  # fmt: skip
    parts = [
        f"policy version {r['policy_version']} (updates before sampling)",
        f"sampler {s.get('kind', '?')} ({settings})",
        f"chat template {r.get('chat_template') or 'none'}",
        f"graders: {graders or 'none'}",
    ]
    return f"<p class='provenance'><small>{esc(' · '.join(parts))}</small></p>"


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
        return boxes(bad) + "<p>No rollouts logged.</p>"
    steps = sorted(by_step)
    out = [boxes(bad)]
    for which, step in [("first", steps[0])] + [("last", steps[-1])] * (len(steps) > 1):
        rs = by_step[step]
        mean = sum(r.get("reward") or 0 for r in rs) / len(rs)
        n_ok = sum(bool(r.get("correct")) for r in rs)
        title = f"step {step} ({which} logged): {len(rs)} rollouts, {n_ok} correct, mean reward {mean:.3g}"
        problems: dict[Any, list[dict[str, Any]]] = {}
        for r in rs:
            problems.setdefault(r.get("problem"), []).append(r)
        body = "".join(
            f'<div class="ex">{esc(p)}<pre>{esc(g[0].get("prompt", ""))}</pre>{"".join(map(_rollout, g))}</div>'
            for p, g in problems.items()
        )
        origin = "".join(dict.fromkeys(provenance_line(r) for r in rs))  # a line per task's graders
        out.append(f"{origin}<details><summary>{esc(title)}</summary>{body}</details>")
    return "".join(out)


def rl_section(stage: Stage, plots: Path) -> str:
    """Gate and probe, the training curves, compute, and sample rollouts from the first and last step."""
    rows, bad = read_metrics(stage.folder / "metrics.jsonl")
    summary = read_json(stage.folder / "rl.json") or {}
    pre = read_json(stage.folder / "probe.json") or {}  # there before step 1: an unfinished stage has it
    parts = [
        boxes(bad),
        gate_and_probe(summary.get("gate") or pre.get("gate"), summary.get("probe") or pre.get("probe")),
    ]
    name = stage.folder.name
    fig = rl_figure(rows, name) if rows else None
    if fig is not None:
        parts.append(embed_figure(fig, plots / f"{name}-curves.png", f"{name} RL curves"))
    else:
        parts.append("<p>No metrics logged.</p>")
    kl_fig = proxy_gold_kl_figure(rows, f"{name}: proxy and gold reward against sqrt KL") if rows else None
    if kl_fig is not None:
        parts.append(
            embed_figure(kl_fig, plots / f"{name}-proxy-gold-kl.png", f"{name} proxy and gold vs sqrt KL")
        )
    parts.append(rl_compute(summary, rows))
    parts.append(contamination_html(summary.get("contamination") or pre.get("contamination"), "RL prompts"))
    parts.append(monitor_table(rows, summary.get("monitors")))
    parts.append(curriculum_table(rows))
    parts.append(rl_episode_table(rows))
    samples = rollout_samples(stage.folder / "rollouts.jsonl")
    parts.append((LEGEND if "class='episode'" in samples else "") + samples)
    return "".join(parts)
