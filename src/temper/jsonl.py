"""JSON Lines, read one way everywhere: the data loader, the metrics log and the report.

Each caller decides what a bad line means (the data loader names file, line and field, the report
notes it and goes on, a resumed metrics log drops the torn last row), so the reader hands the
decode error back in place of the row instead of raising.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, str, Any | json.JSONDecodeError]]:
    """(1-based line number, the line without its newline, parsed value or its `JSONDecodeError`)
    per non-blank line."""
    with Path(path).open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            text = line.rstrip("\r\n")
            try:
                yield line_no, text, json.loads(text)
            except json.JSONDecodeError as err:
                yield line_no, text, err
