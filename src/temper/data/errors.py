"""The error of a row that cannot be used, and of a line that cannot be read as one: below both
the readers of `sources.py` (where rows come from) and the validation of `formats.py` (what they
mean), which import it."""

from __future__ import annotations

import json

from temper.jsonl import DuplicateKeyError


class DataError(ValueError):
    """A row that cannot be used, located by source, line (or row) and field: `file.jsonl:17: ...`
    for a text file, `file.parquet: row 17: ...` for a source numbered by row (a label with
    `by_row`, see `temper.data.sources.SourceLabel`)."""

    def __init__(self, source: str, line: int, field: str, problem: str):
        self.source, self.line, self.field, self.problem = source, line, field, problem
        at = f"{source}: row {line}" if getattr(source, "by_row", False) else f"{source}:{line}"
        super().__init__(f"{at}: field {field!r}: {problem}")


def decode_error(source: str, line: int, err: Exception) -> DataError:
    """The `DataError` of a line that cannot be read as a JSON object: not UTF-8, a duplicate key,
    invalid JSON (what `temper.jsonl` raises for it)."""
    if isinstance(err, UnicodeDecodeError):
        return DataError(
            source, line, "<bytes>", f"not UTF-8: byte {err.object[err.start]:#04x} at column {err.start + 1}"
        )
    if isinstance(err, DuplicateKeyError):
        return DataError(
            source, line, err.key, "appears twice in the object; the last value would silently win"
        )
    assert isinstance(err, json.JSONDecodeError)
    return DataError(source, line, "<json>", f"invalid JSON: {err.msg} at column {err.colno}")
