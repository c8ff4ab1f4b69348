"""The constitutional stage's section: counts, the judge's agreement with the verifier, pair quality,
and a few examples (from `constitutional.json`, `temper.stages.constitutional`)."""

from __future__ import annotations

from pathlib import Path

from temper.report.common import Stage, esc, html_table, number, read_json


def constitutional_section(stage: Stage, plots: Path) -> str:
    """Counts, the judge's agreement with the verifier, pair quality, and a few examples."""
    s = read_json(stage.folder / "constitutional.json")
    if not s:
        return "<p>No constitutional.json.</p>"
    rows = [["prompts", s["prompts"]], ["pairs (= SFT rows)", s["pairs"]]]
    rows += [[f"dropped: {k}", v] for k, v in s["dropped"].items()]
    a = s["agreement"]
    rows += [["verdicts parsed", f"{a['parsed']} of {a['n']}"]]
    for what, b in (("originals and revisions", a), ("originals", s.get("agreement_originals"))):
        if b and b["agreement"] is not None:
            rows += [
                [f"judge agrees with verifier ({what})", f"{number(b['agreement'])} [{number(b['lo'])}, {number(b['hi'])}]"],
                [f"Cohen's kappa ({what})", number(b["kappa"]) if b["kappa"] is not None else "undefined"],
            ]  # fmt: skip
    rows += [[f"pairs {k.replace('_', ' ')}", number(v)] for k, v in s["pair_quality"].items()]
    for name, t in s["tasks"].items():
        rows += [[f"{name}: verifier accuracy original -> revision", f"{number(t['original_accuracy'])} -> {number(t['revision_accuracy'])}"]]  # fmt: skip
    ex = [
        [e["principle"][:40], e["original"][:60], e["critique"][:60], e["revision"][:60], [None if v is None else round(v, 2) for v in e["verdicts"]], e["correct"], e["kept"]]
        for e in s["examples"]
    ]  # fmt: skip
    return (
        html_table(rows, caption=f"judge: {esc(s['judge']['url'] or s['judge']['model'])}")
        + html_table(ex, ["principle", "original", "critique", "revision", "verdicts", "verifier", "kept"], caption="examples")
    )  # fmt: skip
