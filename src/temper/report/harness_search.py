"""The harness_search stage's section: every candidate harness and its scores, the kept one, and
the default vs the kept harness on the final held-out problems."""

from __future__ import annotations

from pathlib import Path

from temper.report.common import Stage, esc, html_table, read_json


def _acc(scores: dict | None) -> str:
    if not scores:
        return "–"
    a = scores["accuracy"]
    failed = scores["failures"]["count"]
    note = f" ({failed} harness/env failures)" if failed else ""
    return f"{100 * a['value']:.1f}% [{100 * a['lo']:.0f}, {100 * a['hi']:.0f}]{note}"


def _settings(settings: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) if settings else ""


def harness_search_section(stage: Stage, plots: Path) -> str:
    summary = read_json(stage.folder / "harness_search.json")
    if not summary:
        return "<p>No harness search finished yet.</p>"
    rows, flagged = [], set()
    for i, c in enumerate(summary["candidates"]):
        if c["folder"] == summary["best"]:
            flagged.add(i)
        train = _acc(c["train"]) if c["train"] else f"refused: {c['error']}"
        rows.append([c["folder"], _settings(c["settings"]), train, _acc(c["held_out"])])
    final = summary["final"]
    n = summary["problems"]
    said = (
        f"<p>Task <b>{esc(summary['task'])}</b>, the model frozen. Each candidate played {n[0]} train "
        f"problems greedily; the best on train were compared on {n[1]} {esc(summary['held_out_split'])} "
        f"problems and <b>{esc(summary['best'])}</b> was kept (<code>best/harness.py</code>). On {n[2]} "
        f"other {esc(summary['held_out_split'])} problems: default {_acc(final['default'])}, kept "
        f"{_acc(final['best'])} (95% Wilson intervals). Code and full traces of each candidate: "
        f"<code>{esc(stage.folder.name)}/candidates/</code>.</p>"
    )
    table = html_table(
        rows,
        ["candidate", "settings", "train accuracy", "held-out accuracy"],
        flagged=flagged,
        caption="candidate harnesses (highlighted: kept)",
    )
    return said + table
