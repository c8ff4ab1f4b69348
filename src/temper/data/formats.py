"""Read training rows in TRL's dataset formats, validating every field up front.

Formats (https://huggingface.co/docs/trl/dataset_formats):
- conversational: {"messages": [{"role": ..., "content": ...}, ...]} (multi-turn, `tool` turns);
  an assistant message may carry `tool_calls` ([{"type": "function", "function": {"name": ...,
  "arguments": {...}}}], content then optional) and a row may carry `tools` (the JSON schemas the
  chat template lists, or that list as a JSON string), as TRL's tool-calling data does;
- prompt-completion: {"prompt": str | messages, "completion": str | messages};
- language modeling: {"text": str} (pre-training corpora; a plain .txt file is one row per line).

A malformed row raises `DataError` naming file, line and field; with `skip_bad_rows=True` it is
counted and skipped instead, and the count is reported. Beyond types, a row is refused when it
would train on nothing or on nonsense: an assistant turn with empty content (it trains on the end
token alone), a conversation that opens with an assistant turn (nothing to condition on), a `tool`
result that answers no assistant turn, a JSON object with a duplicate key (the last value would
silently win), a line that is not UTF-8, and a row whose format differs from the file's first row
(one file, one format, as in TRL's datasets).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from temper.data.errors import DataError
from temper.data.sources import SourceLabel, dataset_rows, locate, read_rows

T = TypeVar("T")

ROLES = ("system", "user", "assistant", "tool")
"""The chat roles a row may use; the built-in tokenizer has a special token and template case for each."""


class NoUsableRowsError(DataError):
    """A data set with nothing left to train on, naming its sources and why each row went."""

    def __init__(self, sources: list[str], reason: str):
        self.source, self.line, self.field, self.problem = ", ".join(sources), 0, "<data>", reason
        ValueError.__init__(
            self, f"no usable training rows in {', '.join(sources) or 'no sources'}: {reason}"
        )


@dataclass(frozen=True)
class Example:
    """One validated row. Exactly one of `messages`, (`prompt`, `completion`) or `text` is set."""

    source: str
    line: int
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[dict[str, Any]] | None = None
    completion: str | list[dict[str, Any]] | None = None
    text: str | None = None
    untrained: tuple[str, ...] = ()
    """Substrings of the assistant turns that an environment inserts (a tool's output written
    inline, `<interpreter>...</interpreter>`): kept in the input, never trained on."""
    tools: list[dict[str, Any]] | None = None  # JSON schemas for `apply_chat_template(tools=)`
    key: str | None = None
    """What identifies the task problem a demonstration was made from, where its prompt does not
    (the task's `problem_key`): the contamination check matches it (`temper.data.contamination`)."""


@dataclass
class LoadReport:
    rows: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # the first few messages, for the report


def _check_messages(
    value: Any,
    where: str,
    source: str,
    line: int,
    need_assistant: bool,
    prior: list[dict[str, Any]] | None = None,
) -> None:
    """`prior`: the already checked messages this list continues (a completion's prompt)."""
    if not isinstance(value, list) or not value:
        raise DataError(source, line, where, "must be a non-empty list of {role, content} messages")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise DataError(source, line, f"{where}[{i}]", "must be an object with role and content")
        role = msg.get("role")
        if role not in ROLES:
            raise DataError(source, line, f"{where}[{i}].role", f"got {role!r}, expected one of {ROLES}")
        content = msg.get("content")
        calls = msg.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            _check_tool_calls(calls, f"{where}[{i}].tool_calls", source, line)
        if not isinstance(content, str) and not (content is None and calls):
            raise DataError(
                source,
                line,
                f"{where}[{i}].content",
                f"must be a string, got {type(content).__name__}"
                + (" (only an assistant turn with tool_calls may have none)" if content is None else ""),
            )
        if role == "tool" and not isinstance(msg.get("name", ""), str):
            raise DataError(source, line, f"{where}[{i}].name", "must be a string (the tool's name)")
        if role == "assistant":
            if not (content or "").strip() and not calls:
                raise DataError(
                    source,
                    line,
                    f"{where}[{i}].content",
                    "is empty: an assistant turn with no content and no tool_calls trains on the end token alone",
                )
        if role == "tool":
            # A tool result answers the assistant turn just before it (a call in `tool_calls` or
            # written inline in the content, as many templates do) or follows another result
            # of the same call; anywhere else nothing asked for it.
            before = value[i - 1]["role"] if i else (prior[-1]["role"] if prior else None)
            if before not in ("assistant", "tool"):
                raise DataError(
                    source,
                    line,
                    f"{where}[{i}].role",
                    f"a 'tool' message must follow the assistant turn that called the tool, not {before or 'nothing'!r}",
                )
    # (the prompt of a completion was checked first, so an opening assistant turn is in `value`)
    whole = (prior or []) + value
    opening = next((j for j, m in enumerate(whole) if m["role"] != "system"), None)
    if opening is not None and whole[opening]["role"] == "assistant":
        raise DataError(
            source,
            line,
            f"{where}[{opening - len(prior or [])}].role",
            "the conversation opens with an assistant turn, which has nothing to condition on; "
            "add the user turn it answers",
        )
    if need_assistant and not any(m["role"] == "assistant" for m in value):
        raise DataError(source, line, where, "has no assistant turn to train on")


def _check_tool_calls(calls: Any, where: str, source: str, line: int) -> None:
    """An assistant message's `tool_calls` in the HF convention: a non-empty list of
    {"type": "function", "function": {"name": str, "arguments": object or its JSON string}}
    (the "function" wrapper optional, as chat templates read both; absent arguments are {})."""
    if not (isinstance(calls, list) and calls):
        raise DataError(source, line, where, "must be a non-empty list")
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise DataError(source, line, at, f"must be an object, got {type(call).__name__}")
        if call.get("type", "function") != "function":
            raise DataError(source, line, f"{at}.type", f"got {call['type']!r}, expected 'function'")
        if "function" in call:
            call, at = call["function"], f"{at}.function"
            if not isinstance(call, dict):
                raise DataError(source, line, at, "must be an object with name and arguments")
        if not isinstance(call.get("name"), str) or not call["name"]:
            raise DataError(source, line, f"{at}.name", "must be a non-empty string (the tool's name)")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as err:
                raise DataError(
                    source,
                    line,
                    f"{at}.arguments",
                    f"is a string but not JSON: {err.msg} at column {err.colno}",
                ) from None
        if not isinstance(arguments, dict):
            raise DataError(
                source,
                line,
                f"{at}.arguments",
                f"must be an object (or its JSON string), got {type(arguments).__name__}",
            )


def _check_tools(value: Any, source: str, line: int) -> list[dict[str, Any]] | None:
    """A row's `tools`: a list of JSON schemas ({"type": "function", "function": {"name", ...}}),
    or that list as a JSON string (TRL's datasets store it so); None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise DataError(
                source, line, "tools", f"is a string but not JSON: {err.msg} at column {err.colno}"
            ) from None
    if not isinstance(value, list):
        raise DataError(source, line, "tools", f"must be a list of tool schemas, got {type(value).__name__}")
    for j, tool in enumerate(value):
        schema = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str) or not schema["name"]:
            raise DataError(
                source,
                line,
                f"tools[{j}]",
                'must be a tool schema {"type": "function", "function": {"name": ...}}',
            )
    return value or None


def parse_row(row: Any, source: str, line: int) -> Example:
    """Validate one decoded row and return it as an `Example`."""
    if not isinstance(row, dict):
        raise DataError(source, line, "<row>", f"must be a JSON object, got {type(row).__name__}")
    if "messages" in row:
        _check_messages(row["messages"], "messages", source, line, need_assistant=True)
        return Example(
            source, line, messages=row["messages"], tools=_check_tools(row.get("tools"), source, line)
        )
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
            _check_messages(completion, "completion", source, line, need_assistant=True, prior=prompt)
            tools = _check_tools(row.get("tools"), source, line)
            return Example(source, line, prompt=prompt, completion=completion, tools=tools)
        return Example(source, line, prompt=prompt, completion=completion)
    if "text" in row:
        if not isinstance(row["text"], str):
            raise DataError(source, line, "text", f"must be a string, got {type(row['text']).__name__}")
        if not row["text"].strip():
            raise DataError(source, line, "text", "is empty")
        return Example(source, line, text=row["text"])
    raise DataError(
        source, line, "<row>", f"has none of 'messages', 'prompt'/'completion', 'text' (keys: {sorted(row)})"
    )


def example_format(example: Example) -> str:
    """The TRL format of a validated row (one file holds one)."""
    if example.messages is not None:
        return "messages"
    if example.prompt is not None:
        chat = isinstance(example.prompt, list) or isinstance(example.completion, list)
        return "prompt/completion (messages)" if chat else "prompt/completion (text)"
    return "text"


def validate_rows(
    rows: Iterable[tuple[int, Any]],
    source: str,
    skip_bad_rows: bool = False,
    parse: Callable[[Any, str, int], T] = parse_row,
    kind: Callable[[T], str] = example_format,
) -> tuple[list[T], LoadReport]:
    """Every (line, decoded row) of `source` through `parse` (SFT rows by default; preference rows
    with `temper.data.preferences.parse_preference`), refusing a row whose `kind` differs from the
    source's first good row. A bad row raises its `DataError`; with `skip_bad_rows` it is counted
    in the report (the first five messages kept) and left out."""
    items: list[T] = []
    report = LoadReport()
    first: tuple[str, int] | None = None  # the format of the source's first good row, and its line
    for line_no, row in rows:
        report.rows += 1
        try:
            if isinstance(row, DataError):
                raise row
            item = parse(row, source, line_no)
            if first is None:
                first = (kind(item), line_no)
            elif kind(item) != first[0]:
                raise DataError(
                    source,
                    line_no,
                    "<row>",
                    f"is a {kind(item)} row but line {first[1]} is a {first[0]} row; keep one format per file",
                )
            items.append(item)
        except DataError as err:
            if not skip_bad_rows:
                raise
            report.skipped += 1
            if len(report.errors) < 5:
                report.errors.append(str(err))
    return items, report


def load_rows(
    spec: str | Path, base_dir: Path | None = None, split: str | None = None, skip_bad_rows: bool = False
) -> tuple[list[Example], LoadReport]:
    """Validated rows of any data source `temper.data.sources.read_rows` reads (JSONL, JSON array,
    parquet, arrow, a `save_to_disk` folder, a hub id); relative paths resolve against `base_dir`."""
    source = locate(spec, base_dir, split)
    rows = ((n, row) for _, n, row in read_rows(source, errors="yield"))
    return validate_rows(rows, source.label, skip_bad_rows)


def load_jsonl(path: str | Path, skip_bad_rows: bool = False) -> tuple[list[Example], LoadReport]:
    """Rows of a .jsonl file (or a .txt file, one `text` row per line); any other source
    `load_rows` reads is read too."""
    return load_rows(path, skip_bad_rows=skip_bad_rows)


def load_hf_dataset(dataset: Any, name: str = "dataset", skip_bad_rows: bool = False):
    """Rows of an in-memory HF `datasets.Dataset` (numbered by row from 1), read through Arrow as
    a parquet or `save_to_disk` source is, so they validate and normalize the same way. A plain
    iterable of row dicts is read as it is."""
    label = SourceLabel(name, by_row=True)
    if hasattr(dataset, "with_format"):
        rows: Iterable[tuple[int, Any]] = dataset_rows(dataset)
    else:
        rows = ((i + 1, row) for i, row in enumerate(dataset))
    return validate_rows(rows, label, skip_bad_rows)


def first_row_is_chat(path: Path) -> bool:
    """Whether a data file holds conversations (its first row; a file mixing formats is refused
    when it is read): `messages`, or a prompt given as a list of messages."""
    try:
        with path.open("rb") as f:
            first = next((line for line in f if line.strip()), b"")
        row = json.loads(first.decode("utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return False  # unreadable: reading it later says where
    return isinstance(row, dict) and ("messages" in row or isinstance(row.get("prompt"), list))
