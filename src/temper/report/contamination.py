"""The `contamination` block of a stage json (`temper.data.contamination`) as a report table."""

from __future__ import annotations

from typing import Any

from temper.report.common import boxes, esc, html_table


def contamination_html(block: dict[str, Any] | None, title: str = "training rows") -> str:
    """Counts per check and per eval set, the first flagged rows, a box when any row overlaps;
    nothing when the stage recorded no check (a run from before it existed)."""
    if not block:
        return ""
    sets = ", ".join(f"{name} ({n})" for name, n in block["eval_sets"].items()) or "none"
    rows = [
        [f"{title} checked", block["rows"]],
        ["exact (a prompt equals an eval prompt)", block["exact"]],
        [f"n-gram ({block['n']}-character, ≥ {100 * block['coverage']:.0f}% coverage)", block["ngram"]],
        ["contaminated (either)", block["contaminated"]],
        *[[f"overlapping {name}", n] for name, n in block["by_eval_set"].items()],
        [f"dropped (action: {block['action']})", block["dropped"]],
    ]
    flagged = {i for i, (k, v) in enumerate(rows) if v and i > 0}
    parts = [
        "<h3>Contamination check</h3>",
        f"<p>Against the eval sets (distinct prompts): {esc(sets)}.</p>",
        html_table(rows, flagged=flagged, caption="rows overlapping an eval set (highlighted: some did)"),
    ]
    if block["contaminated"]:
        verdict = (
            "were dropped before training"
            if block["dropped"]
            else "were trained on (contamination.action: warn)"
        )
        parts.append(
            boxes([f"{block['contaminated']} of {block['rows']} {title} overlap an eval set and {verdict}."])
        )
        parts.append(
            html_table(
                [[e["row"], e["eval_set"], e["how"], e["eval_prompt"]] for e in block["examples"]],
                ["row", "eval set", "how", "eval prompt"],
                caption="first flagged rows",
            )
        )
    if block.get("note"):
        parts.append(f"<p>{esc(block['note'])}.</p>")
    return "".join(parts)
