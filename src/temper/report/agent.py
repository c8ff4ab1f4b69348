"""Agent episodes in the report: per-episode metrics of an RL run and of an evaluation, and whole
episodes with the environment's turns drawn apart from the policy's."""

from __future__ import annotations

import re
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


_ROLE_HEADER = re.compile(r"<\|im_start\|>(?:system|user|assistant|tool)\n?")
_MARKER = re.compile(r"<\|[^|<>\s]{1,40}\|>")


def plain(text: str) -> str:
    """`text` without chat-template markers (`<|user|>`, `<|end|>`, ChatML's `<|im_start|>user`)."""
    return _MARKER.sub("", _ROLE_HEADER.sub("", text)).strip("\n")


def transcript_html(prompt: str, segments: Sequence[Mapping[str, Any]], end: str = "") -> str:
    """An episode as its user reads it: the task, then one row per turn with the agent's action and
    the environment's answer (a shell's output, a page's elements), chat-template markers removed;
    `end` (the grade) in the last turn's answer when the environment said nothing after it. An
    environment answer before any action (an inline tool result) gets a row of its own."""
    rows: list[list[str]] = []
    for s in segments:
        text = plain(s.get("text", ""))
        if s.get("by") == "policy":
            rows.append([str(len(rows) + 1), text, ""])
        elif rows and not rows[-1][2]:
            rows[-1][2] = text
        else:
            rows.append(["", "", text])
    if rows and not rows[-1][2]:
        rows[-1][2] = end
    cells = "".join(
        f"<tr><td>{esc(n)}</td><td><pre>{esc(action)}</pre></td><td><pre>{esc(answer)}</pre></td></tr>"
        for n, action, answer in rows
    )
    return (
        f"<div class='transcript'><pre class='task'>{esc(plain(prompt))}</pre><table>"
        f"<tr><th>turn</th><th>agent</th><th>environment</th></tr>{cells}</table></div>"
    )


def transcripts(task: str, by_model: Mapping[str, Mapping[str, Any]]) -> str:
    """One greedy episode per model of an environment task, as its user reads it (`transcript_html`):
    of the first split evaluated, its first correct example, else its first; the last model's open."""
    out = []
    for model, by_split in by_model.items():
        split, result = next(iter(by_split.items()), ("", {}))
        shown = [e for e in result.get("examples", []) if e.get("episode")]
        if not shown:
            continue
        e = next((e for e in shown if e.get("score", {}).get("correct")), shown[0])
        score = e.get("score", {})
        verdict = "correct" if score.get("correct") else "wrong"
        title = (
            f"one episode as the agent saw it: {task} / {model} / {split} / {e.get('id', '')}: {verdict} "
            f"({score.get('reason')}), {len([s for s in e['episode'] if s.get('by') == 'policy'])} turns"
        )
        end = f"[the episode ends: {verdict}, {score.get('reason')}]"
        out.append((title, transcript_html(e.get("prompt", ""), e["episode"], end)))
    return "".join(
        f"<details{' open' if i == len(out) - 1 else ''}><summary>{esc(title)}</summary>{body}</details>"
        for i, (title, body) in enumerate(out)
    )


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
