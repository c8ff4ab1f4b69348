"""The select stage's section: every candidate checkpoint's criteria, the rule and the choice."""

from __future__ import annotations

from pathlib import Path

from temper.report.common import Stage, esc, html_table, read_json

_SHOWN = {
    "id_accuracy": "ID accuracy",
    "ood_accuracy": "OOD accuracy",
    "parse_rate": "parse rate",
    "length": "length (tokens)",
    "kl": "KL to reference",
}


def _cell(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if key in ("id_accuracy", "ood_accuracy", "parse_rate") else f"{value:.4g}"


def select_section(stage: Stage, plots: Path) -> str:
    summary = read_json(stage.folder / "select.json")
    if not summary:
        return "<p>No selection made yet.</p>"
    rows, chosen = [], None
    for i, c in enumerate(summary["candidates"]):
        mark = "chosen" if c["name"] == summary["chosen"] else ("" if c["feasible"] else "fails a bound")
        rows.append([c["name"], *(_cell(k, c["metrics"].get(k)) for k in _SHOWN), mark])
        chosen = i if c["name"] == summary["chosen"] else chosen
    ref = summary.get("reference")
    said = (
        f"<p>Candidates: the checkpoints of {esc(summary['from'])}, greedy on held-out problems; KL to "
        f"{esc(ref) if ref else '(no reference)'} on each candidate's own samples. Rule: "
        f"<b>{esc(summary['rule'])}</b>. Chosen: <b>{esc(summary['chosen'])}</b>, now this stage's model.</p>"
    )
    head = ["candidate", *_SHOWN.values(), ""]
    return said + html_table(
        rows,
        head,
        flagged={chosen} if chosen is not None else set(),
        caption="candidates (highlighted: chosen)",
    )
