"""The tools a run's episodes called, for the page header: read from the eval stages' episode
summaries (`episodes.signals.tool_calls`, a mean per episode), per task and model.

Why from the episodes rather than the chat template: a tool need not go through the template (the
calculator's inline code tool is text the policy writes, `<code>...</code>`), and a template that
can render tool schemas says nothing about whether a run used any."""

from __future__ import annotations

from typing import Any

from temper.report.common import Stage, esc, read_json


def tool_use(stages: list[Stage]) -> dict[str, dict[str, float]]:
    """task -> model -> tool calls per episode (the mean over the splits evaluated), for every task
    whose episodes called a tool at least once; {} for a run without tool calls."""
    found: dict[str, dict[str, list[float]]] = {}
    for stage in stages:
        results = read_json(stage.folder / "eval.json")  # what an eval stage writes
        for task, by_model in (results or {}).items() if isinstance(results, dict) else ():
            for model, by_split in by_model.items() if isinstance(by_model, dict) else ():
                for r in by_split.values() if isinstance(by_split, dict) else ():
                    calls = _calls(r)
                    if calls is not None:
                        found.setdefault(task, {}).setdefault(model, []).append(calls)
    return {
        task: {m: sum(v) / len(v) for m, v in by_model.items()}
        for task, by_model in found.items()
        if any(c > 0 for v in by_model.values() for c in v)
    }


def _calls(result: Any) -> float | None:
    signals = ((result or {}).get("episodes") or {}).get("signals") if isinstance(result, dict) else None
    value = signals.get("tool_calls") if isinstance(signals, dict) else None
    return float(value) if isinstance(value, int | float) else None


def tools_line(stages: list[Stage]) -> str:
    """`Tools: calculator (sft 0.98, rl 1.02 calls per episode)`, or that no episode called one."""
    used = tool_use(stages)
    if not used:
        return ""
    said = "; ".join(
        f"{task} ({', '.join(f'{m} {c:.2f}' for m, c in by_model.items())} calls per episode)"
        for task, by_model in used.items()
    )
    return f"<p>Tools: <b>{esc(said)}</b></p>"
