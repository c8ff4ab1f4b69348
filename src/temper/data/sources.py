"""Where rows come from: one reader for every data set a recipe or a command names.

A data source is a string, read by its form:
- a `.jsonl` file (one JSON object per line; a `.json` file holding one object per line too),
- a `.json` file holding one JSON array of objects,
- a `.parquet` file, or an `.arrow` file (Arrow IPC, file or stream format, as `datasets` writes),
- a folder written by `datasets`' `save_to_disk` (a `Dataset`, or a `DatasetDict` whose split is
  picked by `split`, default `train`),
- a `.txt` file (one `{"text": line}` row per non-blank line, for pre-training corpora),
- anything else that is not an existing path: a hub data set id, loaded with
  `datasets.load_dataset` (`org/name`, or `org/name:config` for a named configuration).
A trailing `[split]` picks the split of a folder or hub id inside the string itself (`data/ds[test]`,
`openai/gsm8k:main[test]`), so a recipe's list of files can name one; `datasets`' slices work for
hub ids (`name[train[:100]]`).

Rows come back as (source label, 1-based number, row dict). Text files are numbered by line, so a
`DataError` reads `file.jsonl:17: field ...` (what editors jump to); tables, JSON arrays and
`datasets` objects by row, `file.parquet: row 17: field ...`. The label carries which
(`SourceLabel.by_row`), so anyone raising a `DataError` with it gets the same form.

Rows read through Arrow (parquet, arrow, `datasets`) are normalized to what the same data gives
as JSONL: Arrow stores a list of messages as a list of structs with the union of their keys, so a
message without `tool_calls` comes back with `tool_calls: None`; such null fields inside the
row's values are dropped (a chat template testing `message.tool_calls is defined` would otherwise
take every turn for a tool call). Top-level columns are kept as they are (a table has every column).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from temper.data.errors import DataError, decode_error
from temper.jsonl import DuplicateKeyError, iter_jsonl, strict_object

TEXT_SUFFIXES = (".jsonl", ".json", ".txt")
TABLE_SUFFIXES = (".parquet", ".arrow")
SUFFIXES = TEXT_SUFFIXES + TABLE_SUFFIXES


class SourceLabel(str):
    """The name rows of a source carry (`Example.source`, `DataError.source`); `by_row` when the
    source is numbered by row rather than by line."""

    by_row: bool

    def __new__(cls, text: str, by_row: bool) -> SourceLabel:
        label = super().__new__(cls, text)
        label.by_row = by_row
        return label

    def __getnewargs__(self) -> tuple[str, bool]:  # (pickle and deepcopy rebuild it with both)
        return str(self), self.by_row


class SourceError(DataError):
    """A data source that cannot be read at all (missing, not a data set, no such split)."""

    def __init__(self, source: str, problem: str):
        self.source, self.line, self.field, self.problem = source, 0, "<source>", problem
        ValueError.__init__(self, f"{str(source)!r} {problem}")


class SourceNotFoundError(SourceError, FileNotFoundError):
    """A data source path that does not exist (also a `FileNotFoundError`)."""


@dataclass(frozen=True)
class Source:
    """A located data source: what `read_rows` will read, found without reading any row."""

    kind: Literal["jsonl", "json", "txt", "parquet", "arrow", "disk", "hub"]
    label: SourceLabel
    path: Path | None = None  # a local file or folder; for a hub id, the local path tried first
    name: str | None = None  # a hub id
    config: str | None = None  # a hub configuration
    split: str | None = None  # a DatasetDict's or hub data set's split (None: the whole Dataset)


_SPLIT = re.compile(r"^(?P<base>.+?)\[(?P<split>[^\[\]]+(?:\[[^\[\]]*\])?)\]$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")


def resolve_path(spec: str | Path, base_dir: Path | None) -> Path:
    """A path as a recipe means it: `~` expanded, relative to `base_dir` (the recipe's folder)."""
    p = Path(spec).expanduser()
    if p.is_absolute() or base_dir is None:
        return p
    return (base_dir / p).resolve()


def locate(spec: str | Path, base_dir: Path | None = None, split: str | None = None) -> Source:
    """Find what `spec` names; raise `SourceNotFoundError` / `SourceError` if it cannot be read.

    Only looks at the file system (and at a `save_to_disk` folder's split list): a hub id is
    returned as it is, its availability is `check_hub`'s business."""
    text = str(spec)
    path = resolve_path(text, base_dir)
    if not path.exists():
        match = _SPLIT.match(text)
        if match:  # `folder[test]`, `org/name:config[test]`
            if split is not None and split != match["split"]:
                raise SourceError(text, f"names split {match['split']!r}, but split {split!r} was asked for")
            text, split = match["base"], match["split"]
            path = resolve_path(text, base_dir)
    if path.is_dir():
        return _locate_folder(path, split)
    if path.is_file():
        kind = path.suffix.lower().lstrip(".")
        if kind not in ("jsonl", "json", "txt", "parquet", "arrow"):
            raise SourceError(
                str(path),
                f"has an unknown data file type {path.suffix or '(no suffix)'!r}; expected one of {SUFFIXES}",
            )
        if split is not None:
            raise SourceError(
                str(path),
                f"is a file, which has no splits (split {split!r} was asked for); splits are "
                "those of save_to_disk folders and hub ids",
            )
        if kind == "json" and _is_array(path):
            return Source("json", SourceLabel(str(path), by_row=True), path=path)
        if kind == "json":  # JSON Lines under a .json name
            return Source("jsonl", SourceLabel(str(path), by_row=False), path=path)
        return Source(kind, SourceLabel(str(path), by_row=kind in ("parquet", "arrow")), path=path)  # type: ignore[arg-type]
    if _looks_like_path(text) or not _HUB_ID.match(text):
        raise SourceNotFoundError(str(path), _missing(text, path, base_dir))
    name, _, config = text.partition(":")
    split = split or "train"
    label = f"{name}{':' + config if config else ''}[{split}]"
    return Source(
        "hub", SourceLabel(label, by_row=True), path=path, name=name, config=config or None, split=split
    )


def _looks_like_path(text: str) -> bool:
    """What a hub id cannot be: a file suffix we read, a leading `.`/`/`/`~`, or more than one slash."""
    return (
        text.lower().endswith(SUFFIXES)
        or text.startswith((".", "/", "~"))
        or text.strip("/").count("/") > 1
        or (os.sep != "/" and os.sep in text)
    )


def _missing(text: str, path: Path, base_dir: Path | None) -> str:
    """Says which path was tried and, when the name exists relative to the working directory
    instead, that it was not used (recipe paths are relative to the recipe's folder)."""
    message = "does not exist" + (f" (tried {path})" if str(path) != text else "")
    if base_dir is not None and not Path(text).expanduser().is_absolute():
        here = Path(text).expanduser().resolve()
        if here.exists() and here != path:
            message += (
                f"; {here} exists relative to the current directory, but paths in a recipe are "
                "relative to the recipe's folder: write it relative to the recipe, or absolute"
            )
    return message


def _locate_folder(path: Path, split: str | None) -> Source:
    if (path / "dataset_dict.json").is_file():
        splits = _splits(path)
        split = split or "train"
        if split not in splits:
            raise SourceError(
                str(path),
                f"has no split {split!r}; its splits are {splits} (pick one with `{path.name}[SPLIT]`)",
            )
        return Source("disk", SourceLabel(f"{path}[{split}]", by_row=True), path=path, split=split)
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        if split is not None:
            raise SourceError(
                str(path), f"is a single Dataset (no splits), but split {split!r} was asked for"
            )
        return Source("disk", SourceLabel(str(path), by_row=True), path=path)
    raise SourceError(
        str(path),
        "is a folder but not one `datasets` wrote with save_to_disk (no dataset_dict.json, or "
        "state.json and dataset_info.json); name a data file inside it instead",
    )


def _splits(path: Path) -> list[str]:
    try:
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits")
    except (OSError, ValueError, AttributeError) as err:
        raise SourceError(str(path), f"has a dataset_dict.json that cannot be read: {err}") from None
    if not isinstance(splits, list):
        raise SourceError(str(path), "has a dataset_dict.json with no list of splits")
    return [str(s) for s in splits]


def _is_array(path: Path) -> bool:
    """Whether a .json file holds a JSON array (its first non-blank character is `[`)."""
    with path.open("rb") as f:
        head = f.read(4096)
    if head.startswith(codecs.BOM_UTF8):
        head = head[len(codecs.BOM_UTF8) :]
    return head.lstrip()[:1] == b"["


def check_source(spec: str | Path, base_dir: Path | None = None, split: str | None = None) -> str | None:
    """Why a data source cannot be read, found without reading its rows (at plan time), or None."""
    try:
        source = locate(spec, base_dir, split)
    except SourceError as err:
        return str(err)
    if source.kind == "hub":
        problem = check_hub(source)
        return f"{source.label!r} {problem}" if problem else None
    if not os.access(source.path, os.R_OK):
        return f"{str(source.path)!r} is not readable (permission denied)"
    return None


def count_rows(source: Source) -> int | None:
    """Rows of a local source, counted cheaply (file metadata, or lines); None for a hub id."""
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(source.path).metadata.num_rows
    if source.kind == "disk":
        import datasets

        loaded = datasets.load_from_disk(str(source.path))
        return (loaded[source.split] if source.split is not None else loaded).num_rows
    if source.kind in ("jsonl", "txt"):
        return sum(1 for line in source.path.read_bytes().split(b"\n") if line.strip())
    if source.kind in ("json", "arrow"):
        return sum(1 for _ in _rows(source))
    return None


def read_rows(
    spec: str | Path | Source,
    base_dir: Path | None = None,
    split: str | None = None,
    *,
    errors: Literal["raise", "yield"] = "raise",
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(source label, 1-based line or row number, row) for every row of a data source (see the
    module docstring for the forms `spec` takes, or a `Source` from `locate`); relative paths
    resolve against `base_dir` (default: the working directory).

    A row that cannot be decoded (not UTF-8, not JSON, a duplicate key) raises `DataError` naming
    source, number and field; with `errors="yield"` the error comes back in place of the row and
    reading goes on where it can (`skip_bad_rows`). A row that decodes to something other than an
    object comes back as it is, for the row validator to refuse (`temper.data.formats.parse_row`).
    """
    source = spec if isinstance(spec, Source) else locate(spec, base_dir, split)
    for number, row in _rows(source):
        if isinstance(row, DataError) and errors == "raise":
            raise row
        yield source.label, number, row


def _rows(source: Source) -> Iterator[tuple[int, Any]]:
    label = source.label
    if source.kind == "txt":
        yield from _txt_rows(source.path, label)
    elif source.kind == "jsonl":
        for line_no, _, row in iter_jsonl(source.path):
            if isinstance(row, (json.JSONDecodeError, UnicodeDecodeError, DuplicateKeyError)):
                row = decode_error(label, line_no, row)
            yield line_no, row
    elif source.kind == "json":
        yield from _array_rows(source.path, label)
    elif source.kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(source.path)
        except (pa.ArrowException, OSError) as err:
            raise SourceError(label, f"cannot be read as parquet: {err}") from None
        yield from _arrow_rows(parquet.iter_batches())
    elif source.kind == "arrow":
        yield from _arrow_rows(_arrow_batches(source.path, label))
    elif source.kind == "disk":
        import datasets

        loaded = datasets.load_from_disk(str(source.path))
        yield from dataset_rows(loaded[source.split] if source.split is not None else loaded)
    else:
        yield from dataset_rows(_hub_dataset(source))


def _txt_rows(path: Path, label: str) -> Iterator[tuple[int, Any]]:
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as err:
            yield line_no, decode_error(label, line_no, err)
            continue
        if text.strip():
            yield line_no, {"text": text}


def _array_rows(path: Path, label: str) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON array, numbered from 1. An element naming a key twice is an error
    for that element alone; invalid JSON raises even when bad rows are skipped, as nothing after
    it can be located."""
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:  # one array: no row can be read
        line = data.count(b"\n", 0, err.start) + 1
        raise SourceError(label, f"is not UTF-8: byte {err.object[err.start]:#04x} on line {line}") from None
    strict, loose = json.JSONDecoder(object_pairs_hook=strict_object), json.JSONDecoder()
    space = re.compile(r"\s*")
    i = space.match(text, 0).end() + 1  # past the `[` (`_is_array` saw it)
    row = 0
    while True:
        i = space.match(text, i).end()
        if text.startswith("]", i):
            if text[i + 1 :].strip():
                raise _json_error(label, row + 1, text, i + 1, "extra data after the array")
            return
        if row:
            if not text.startswith(",", i):
                raise _json_error(label, row + 1, text, i, "expected ',' or ']' after an element")
            i = space.match(text, i + 1).end()
        row += 1
        try:
            value, i = strict.raw_decode(text, i)
        except DuplicateKeyError as err:
            _, i = loose.raw_decode(text, i)
            value = decode_error(label, row, err)
        except json.JSONDecodeError as err:  # where the element ends is unknown: the rest is lost
            raise _json_error(label, row, text, err.pos, err.msg) from None
        yield row, value


def _json_error(label: str, row: int, text: str, pos: int, msg: str) -> DataError:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return DataError(label, row, "<json>", f"invalid JSON: {msg} at line {line} column {column}")


def _arrow_batches(path: Path, label: str) -> Iterator[Any]:
    """Record batches of an Arrow IPC file: the random-access file format, or the stream format
    `datasets` writes (`data-00000-of-00001.arrow`)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            try:
                reader = pa.ipc.open_file(source)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            except pa.ArrowInvalid:
                batches = list(pa.ipc.open_stream(source))
    except (pa.ArrowInvalid, OSError) as err:
        raise SourceError(label, f"cannot be read as an Arrow IPC file or stream: {err}") from None
    yield from batches


def dataset_rows(dataset: Any) -> Iterator[tuple[int, Any]]:
    """A `datasets.Dataset`'s rows through Arrow, as a parquet file of the same table gives them."""
    return _arrow_rows(dataset.with_format("arrow").iter(batch_size=1024))


def _arrow_rows(batches: Any) -> Iterator[tuple[int, Any]]:
    row = 0
    for batch in batches:
        for record in batch.to_pylist():
            row += 1
            yield row, {key: _drop_nulls(value) for key, value in record.items()}


def _drop_nulls(value: Any) -> Any:
    """A value as JSON would have it: dict fields Arrow filled with null (absent in that row) removed."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def hub_offline() -> bool:
    return any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_endpoint() -> str:
    """The hub's address: HF_ENDPOINT, as the hub client reads it, else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


_reachable: bool | None = None


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the hub answers one HTTP request (any status) within `timeout` seconds; asked once
    per process. A thread bounds the wait, as name resolution ignores socket timeouts; urllib
    goes through the same proxy settings (HTTPS_PROXY) the hub client does."""
    global _reachable
    if _reachable is None:
        result: list[bool] = []

        def probe() -> None:
            request = urllib.request.Request(hub_endpoint(), method="HEAD")
            try:
                response = urllib.request.urlopen(request, timeout=timeout)
                if response is not None:  # None: an opener with no handler for the endpoint's scheme
                    response.close()
                result.append(response is not None)
            except urllib.error.HTTPError:  # an answer, even 404, means the hub is there
                result.append(True)
            except (OSError, ValueError):  # URLError, timeout, TLS failure, a malformed endpoint
                result.append(False)

        thread = threading.Thread(target=probe, daemon=True)
        thread.start()
        thread.join(timeout)
        _reachable = bool(result and result[0])
    return _reachable


def check_hub(source: Source) -> str | None:
    """Why a hub data set cannot be loaded now (offline and not cached, or the hub unreachable),
    or None. Asked before any download so that it fails at once, not after retries."""
    local = f"is not a local file or folder (tried {source.path})"
    if hub_offline():
        try:
            import datasets

            datasets.load_dataset_builder(source.name, source.config)
        except Exception as err:  # not in the cache: datasets raises its own connection errors
            return (
                f"{local}, and as a hub data set it is not in the local cache "
                f"while HF_HUB_OFFLINE is set ({type(err).__name__}: {err})"
            )
        return None
    if not hub_reachable():
        return (
            f"{local}, and the hub ({hub_endpoint()}) cannot be reached to load it "
            "as a data set (HF_HUB_OFFLINE=1 uses the local cache)"
        )
    return None


def _hub_dataset(source: Source) -> Any:
    problem = check_hub(source)
    if problem:
        raise SourceNotFoundError(source.label, problem)
    import datasets

    try:
        return datasets.load_dataset(source.name, source.config, split=source.split)
    except ValueError as err:  # an unknown split or configuration
        raise SourceError(source.label, f"cannot be loaded: {err}") from None
