"""What every report section uses: reading a stage's files, HTML tables and boxes, embedded plots."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from temper.jsonl import iter_jsonl

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
.toks { font: 13px/1.9 ui-monospace, monospace; white-space: pre-wrap; background: #fafafa; padding: 0.5em; border: 1px solid #eee; }
p .toks { padding: 0.1em 0.2em; }
.toks > span { display: inline-block; white-space: pre; border: 1px solid #ddd; border-radius: 2px; margin: 0 1px 1px 0; padding: 0 1px; line-height: 1.4; color: #888; }
.toks > span.sup { background: #c9efc9; border-color: #7c7; color: #111; }
.toks > span.sp { font-weight: bold; color: #a05; }
.toks .ws { color: #bbb; } .toks > span.sup .ws { color: #4a4; }
.transcript table td { vertical-align: top; } .transcript td pre { margin: 0; white-space: pre-wrap; }
.transcript td:nth-child(2) pre { background: #c9efc9; } .transcript td:nth-child(3) pre { background: #e4e4f4; }
.transcript pre.task { background: #f4f4f4; font-weight: bold; }
.episode .pol { background: #c9efc9; } .episode .env { background: #e4e4f4; color: #446; }
.episode .row { display: block; border-top: 2px dashed #a66; color: #a66; margin-top: 0.3em; }
.episode .summary { background: #f6e3a8; font-weight: bold; }
.episode .env::before { content: "env▸"; font-size: 10px; color: #88a; vertical-align: super; }
details { margin: 0.4em 0; } summary { cursor: pointer; } .ex { border-top: 1px solid #eee; padding: 0.4em 0; }
"""


@dataclass(frozen=True)
class Stage:
    folder: Path
    kind: str
    seconds: float | None  # None until stage.json marks the stage complete


def esc(x: Any) -> str:
    """`x` as text safe inside HTML."""
    return html.escape(str(x))


def read_json(path: Path) -> Any:
    """The parsed file, or None when it does not exist; a broken file is an error naming it."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def duration(seconds: float | None) -> str:
    """A stage's time as people read it (12.3s, 4m 05s, 1h 02m); – when unknown."""
    if seconds is None:
        return "–"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m {s:02d}s" if m < 60 else f"{m // 60}h {m % 60:02d}m"


def read_metrics(path: Path, what: str = "metrics row") -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a metrics.jsonl (or any JSONL of rows with a "step") and one message per line
    that is not such a row.

    MetricsLog appends without a rename, so a killed run can leave a torn last line; the page names
    the file and line instead of losing the whole report to it."""
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    if not path.exists():
        return rows, bad
    for i, line, row in iter_jsonl(path):
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
        else:
            bad.append(f"{path}:{i}: not a {what}, skipped: {line[:80]!r}")
    return rows, bad


def boxes(messages: list[str]) -> str:
    """Each message in a highlighted box (warnings, notes a reader must not miss)."""
    return "".join(f'<div class="box">{esc(m)}</div>' for m in messages)


def embed_figure(fig: Figure, png: Path, alt: str) -> str:
    """Write the figure to `png` and return an <img> carrying the same bytes as a data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    png.write_bytes(buf.getvalue())
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def html_table(
    rows: list[list[Any]],
    head: Sequence[str] = (),
    flagged: AbstractSet[int] = frozenset(),
    caption: str = "",
) -> str:
    """A table of plain-text (escaped) cells; rows whose index is in `flagged` are highlighted."""
    th = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>" if head else ""
    tds = ["".join(f"<td>{esc(c)}</td>" for c in row) for row in rows]
    trs = "".join(
        f"<tr class='warn'>{t}</tr>" if i in flagged else f"<tr>{t}</tr>" for i, t in enumerate(tds)
    )
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}{th}{trs}</table>" if rows else ""


def number(v: Any) -> str:
    """A table cell's number: 4 significant digits for a float, thousands separators for an int."""
    return f"{v:.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def percent(v: float) -> str:
    """A share in [0, 1] as a whole percentage."""
    return f"{100 * v:.0f}%"


def correct_mark(correct: Any) -> str:
    """A sample's verdict as a coloured "correct" or "wrong"."""
    return '<b class="good">correct</b>' if correct else '<b class="bad">wrong</b>'
