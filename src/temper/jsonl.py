"""JSON Lines, read one way everywhere: the data loader, the metrics log and the report.

Each caller decides what a bad line means (the data loader names file, line and field, the report
notes it and goes on, a resumed metrics log drops the torn last row), so the reader hands the
error back in place of the row instead of raising. Three kinds of bad line come back:
`json.JSONDecodeError` (not JSON), `UnicodeDecodeError` (not UTF-8: the file is read as bytes
and decoded line by line, so one bad byte costs one line, not the file) and `DuplicateKeyError`
(an object naming a key twice, where `json.loads` would silently keep the last value).
A UTF-8 byte-order mark at the start of the file, which many editors write, is dropped.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DuplicateKeyError(ValueError):
    """A JSON object that names the same key twice."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"duplicate key {key!r}")


def strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json`'s `object_pairs_hook` that refuses a key named twice (`DuplicateKeyError`)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def iter_jsonl(
    path: str | Path,
) -> Iterator[tuple[int, str, Any | json.JSONDecodeError | UnicodeDecodeError | DuplicateKeyError]]:
    """(1-based line number, the line without its newline, parsed value or the error) per
    non-blank line."""
    data = Path(path).read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            yield line_no, raw.decode("utf-8", errors="replace").rstrip("\r"), err
            continue
        if not line.strip():
            continue
        text = line.rstrip("\r")
        try:
            yield line_no, text, json.loads(text, object_pairs_hook=strict_object)
        except (json.JSONDecodeError, DuplicateKeyError) as err:
            yield line_no, text, err
        except RecursionError:  # json's C decoder recurses once per nested `[` or `{`
            yield line_no, text, json.JSONDecodeError("nested too deeply to read", text, 0)
