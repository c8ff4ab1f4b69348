"""Read training rows in TRL's dataset formats, validating every field up front.

Formats (https://huggingface.co/docs/trl/dataset_formats):
- conversational: {"messages": [{"role": ..., "content": ...}, ...]} (multi-turn, `tool` turns);
- prompt-completion: {"prompt": str | messages, "completion": str | messages};
- language modeling: {"text": str} (pre-training corpora; a plain .txt file is one row per line).

A malformed row raises `DataError` naming file, line and field; with `skip_bad_rows=True` it is
counted and skipped instead, and the count is reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.jsonl import iter_jsonl

ROLES = ("system", "user", "assistant", "tool")
"""The chat roles a row may use; the built-in tokenizer has a special token and template case for each."""


class DataError(ValueError):
    """A row that cannot be used, located by source, line and field."""

    def __init__(self, source: str, line: int, field: str, problem: str):
        self.source, self.line, self.field, self.problem = source, line, field, problem
        super().__init__(f"{source}:{line}: field {field!r}: {problem}")


@dataclass(frozen=True)
class Example:
    """One validated row. Exactly one of `messages`, (`prompt`, `completion`) or `text` is set."""

    source: str
    line: int
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[dict[str, Any]] | None = None
    completion: str | list[dict[str, Any]] | None = None
    text: str | None = None


@dataclass
class LoadReport:
    rows: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # the first few messages, for the report


def _check_messages(value: Any, where: str, source: str, line: int, need_assistant: bool) -> None:
    if not isinstance(value, list) or not value:
        raise DataError(source, line, where, "must be a non-empty list of {role, content} messages")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise DataError(source, line, f"{where}[{i}]", "must be an object with role and content")
        role = msg.get("role")
        if role not in ROLES:
            raise DataError(source, line, f"{where}[{i}].role", f"got {role!r}, expected one of {ROLES}")
        content = msg.get("content")
        if not isinstance(content, str):
            raise DataError(
                source, line, f"{where}[{i}].content", f"must be a string, got {type(content).__name__}"
            )
    if need_assistant and not any(m["role"] == "assistant" for m in value):
        raise DataError(source, line, where, "has no assistant turn to train on")


def parse_row(row: Any, source: str, line: int) -> Example:
    """Validate one decoded row and return it as an `Example`."""
    if not isinstance(row, dict):
        raise DataError(source, line, "<row>", f"must be a JSON object, got {type(row).__name__}")
    if "messages" in row:
        _check_messages(row["messages"], "messages", source, line, need_assistant=True)
        return Example(source, line, messages=row["messages"])
    if "prompt" in row or "completion" in row:
        for key in ("prompt", "completion"):
            if key not in row:
                raise DataError(source, line, key, "missing (prompt-completion rows need both)")
        prompt, completion = row["prompt"], row["completion"]
        if isinstance(prompt, str) != isinstance(completion, str):
            raise DataError(
                source,
                line,
                "completion",
                "prompt and completion must both be strings or both be message lists",
            )
        if isinstance(prompt, str):
            if not completion:
                raise DataError(source, line, "completion", "is empty")
        else:
            _check_messages(prompt, "prompt", source, line, need_assistant=False)
            _check_messages(completion, "completion", source, line, need_assistant=True)
        return Example(source, line, prompt=prompt, completion=completion)
    if "text" in row:
        if not isinstance(row["text"], str):
            raise DataError(source, line, "text", f"must be a string, got {type(row['text']).__name__}")
        return Example(source, line, text=row["text"])
    raise DataError(
        source, line, "<row>", f"has none of 'messages', 'prompt'/'completion', 'text' (keys: {sorted(row)})"
    )


def _raw_rows(path: Path) -> Iterator[tuple[int, Any]]:
    if path.suffix == ".txt":
        with path.open(encoding="utf-8") as f:
            yield from ((i, {"text": line.rstrip("\n")}) for i, line in enumerate(f, start=1) if line.strip())
        return
    for line_no, _, row in iter_jsonl(path):
        if isinstance(row, json.JSONDecodeError):
            row = DataError(str(path), line_no, "<json>", f"invalid JSON: {row.msg} at column {row.colno}")
        yield line_no, row


def validate_rows(
    rows: Iterable[tuple[int, Any]], source: str, skip_bad_rows: bool = False
) -> tuple[list[Example], LoadReport]:
    examples, report = [], LoadReport()
    for line_no, row in rows:
        report.rows += 1
        try:
            if isinstance(row, DataError):
                raise row
            examples.append(parse_row(row, source, line_no))
        except DataError as err:
            if not skip_bad_rows:
                raise
            report.skipped += 1
            if len(report.errors) < 5:
                report.errors.append(str(err))
    return examples, report


def load_jsonl(path: str | Path, skip_bad_rows: bool = False) -> tuple[list[Example], LoadReport]:
    """Rows of a .jsonl file (or a .txt file, one `text` row per line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    return validate_rows(_raw_rows(path), str(path), skip_bad_rows)


def load_hf_dataset(dataset: Iterable[dict[str, Any]], name: str = "dataset", skip_bad_rows: bool = False):
    """Rows of an in-memory HF `datasets.Dataset` (row numbers are 1-based indices)."""
    return validate_rows(((i + 1, row) for i, row in enumerate(dataset)), name, skip_bad_rows)
