"""Agent episodes in the report: per-episode metrics of an RL run and of an evaluation, and whole
episodes with the environment's turns drawn apart from the policy's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from temper.report.common import esc, html_table, number, percent

LEGEND = (
    "<p><small>Episodes: <span class='episode'><span class='pol'>policy tokens (trained on)</span> "
    "<span class='env'>environment tokens (tool output, observations, chat headers; never trained on)</span> "
    "<span class='pol summary'>a self-summary the harness asked for (trained)</span>"
    "</span></small></p>"
)


ROW_START = {
    "rewritten": "row {}: the agent rewrote its history, a new training row starts (its prompt never trained on)",
    "summarised": "row {}: the context budget was reached; the new row starts from the task, the summary above "
    "and the latest observation (its prompt never trained on)",
    "truncated": "row {}: the context budget was reached; the oldest turns are dropped, a new row starts from "
    "the task and the latest turns (its prompt never trained on)",
}
"""The rule drawn where a training row starts, by its `cause` (`rollout.trajectory.ROW_CAUSES`)."""


def episode_html(segments: Sequence[Mapping[str, Any]]) -> str:
    """A whole episode: each segment ({"by": "policy" | "env", "text"}) in its own colour, a
    self-summary (`summary`) marked as one, and a rule where a new training row starts
    (`row_start`, saying its `cause`: a rewritten history, a summary, a truncation)."""

    def rule(s: Mapping[str, Any]) -> str:
        said = ROW_START.get(s.get("cause", "rewritten"), ROW_START["rewritten"]).format(s.get("row"))
        return f"<span class='row'>{esc(said)}</span>" if s.get("row_start") else ""

    def span(s: Mapping[str, Any]) -> str:
        if s.get("summary"):
            return f"<span class='pol summary' title='self-summary (trained)'>[summary] {esc(s.get('text', ''))}</span>"
        return f"<span class='{'pol' if s.get('by') == 'policy' else 'env'}'>{esc(s.get('text', ''))}</span>"

    return f"<pre class='episode'>{''.join(rule(s) + span(s) for s in segments)}</pre>"


def _label(key: str) -> str:
    kind, name = key.split("/", 1)
    label = name.replace("stop_", "stop: ").replace("_", " ")
    if kind == "gateway":  # episodes of several rows (`train/rl_metrics.episode_metrics`): a rewritten
        # history (the gateway's agents, a prune) or a context budget's compaction
        label = {
            "rewrites": "rows: new training rows started (per step; rewrites, summaries, truncations)",
            "segments_per_episode": "rows: training rows per episode",
        }.get(name, label)
    if kind == "parallel":  # orchestrator RL (`train/features/parallel.py`)
        label = "orchestrator: " + _PARALLEL.get(name, label)
    return label


_PARALLEL = {
    "weight": "parallel reward weight w(t) (per step)",
    "critical_path": "critical path (turns + slowest worker per batch)",
    "total_steps": "total steps (turns + every worker's steps)",
    "subagents": "sub-agent calls",
    "spawns": "spawn turns (parallel batches)",
    "unused": "sub-agent results unused",
    "measure": "parallel measure 1 - critical / total",
}


def rl_episode_table(rows: list[dict[str, Any]]) -> str:
    """Per-episode means (turns, tokens, environment seconds, each step signal summed over the
    episode, a gateway episode's training rows, an orchestrator's critical path and total steps)
    and the share of each stop reason, over the first and the last tenth of the steps; and the
    calls per step that rewrote an agent's history."""
    prefixes = ("episode/", "signal/", "gateway/", "parallel/")
    keys = sorted({k for r in rows for k in r if k.startswith(prefixes)})
    if not keys:
        return ""
    tenth = max(1, len(rows) // 10)
    spans = {"first steps": rows[:tenth], "last steps": rows[-tenth:]}

    def mean(rs: list[dict[str, Any]], key: str) -> str:
        vs = [r[key] for r in rs if isinstance(r.get(key), int | float)]
        if not vs:
            return "–"
        v = sum(vs) / len(vs)
        return percent(v) if "/stop_" in key else number(round(v, 3))

    table = [[_label(k)] + [mean(rs, k) for rs in spans.values()] for k in keys]
    head = ["per episode", *(f"{name} ({len(rs)})" for name, rs in spans.items())]
    return html_table(
        table, head, caption="agent episodes: means per episode (signals summed over its steps)"
    )


def eval_episode_table(by_model: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per model x split of an environment task: turns, policy tokens, environment
    seconds and every step signal per episode, and the stop reasons."""
    rows, signals = (
        [],
        sorted(
            {
                k
                for by in by_model.values()
                for r in by.values()
                for k in (r.get("episodes") or {}).get("signals", {})
            }
        ),
    )
    for model, by_split in by_model.items():
        for split, r in by_split.items():
            e = r.get("episodes")
            if not e:
                continue
            stops = ", ".join(f"{k} {v}" for k, v in e.get("stop_reasons", {}).items())
            rows.append(
                [
                    model,
                    split,
                    e["episodes"],
                    number(round(e["turns"], 2)),
                    number(round(e["policy_tokens"], 1)),
                ]
                + [number(round(e["signals"].get(s, 0.0), 3)) for s in signals]
                + [f"{e['env_seconds']:.3g}s", stops]
            )
    head = ["model", "split", "episodes", "turns", "policy tokens", *(s.replace("_", " ") for s in signals)]
    head += ["env time", "stop reasons"]
    return html_table(rows, head, caption="episodes (greedy and sampled): means per episode")
