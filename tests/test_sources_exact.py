"""Exact tests of `temper.data.sources`: every refusal's whole message (what a user reads, with
the path and the option it names), the kind, label and numbering of each form, and the row counts.
Written against the mutants mutmut left alive (TESTING.md)."""

import codecs
import json
import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from temper.data import DataError, read_rows, sources
from temper.data.sources import (
    SUFFIXES,
    Source,
    SourceError,
    SourceLabel,
    SourceNotFoundError,
    check_hub,
    check_source,
    count_rows,
    hub_offline,
    locate,
    resolve_path,
)

ROWS = [
    {"prompt": "a", "completion": "b"},
    {"prompt": "c", "completion": "d"},
    {"prompt": "e", "completion": "f"},
]


def jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def message(excinfo):
    return str(excinfo.value)


def test_suffixes_are_the_five_forms_read():
    assert SUFFIXES == (".jsonl", ".json", ".txt", ".parquet", ".arrow")


def test_a_source_error_is_a_data_error_at_line_0_of_field_source():
    err = SourceError("x.jsonl", "is bad")
    assert str(err) == "'x.jsonl' is bad"
    assert (err.source, err.line, err.field, err.problem) == ("x.jsonl", 0, "<source>", "is bad")
    assert isinstance(SourceNotFoundError("x", "y"), FileNotFoundError)


def test_resolve_path_expands_home_and_keeps_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path("~/d.jsonl", tmp_path / "r") == tmp_path / "home" / "d.jsonl"
    assert resolve_path("d.jsonl", None) == type(tmp_path)("d.jsonl")
    assert resolve_path("sub/../d.jsonl", tmp_path) == tmp_path / "d.jsonl"  # resolved
    assert resolve_path(tmp_path / "a", tmp_path / "b") == tmp_path / "a"


def test_each_file_kind_its_label_and_whether_it_is_numbered_by_row(tmp_path):
    jsonl(tmp_path / "a.jsonl")
    jsonl(tmp_path / "lines.json")
    (tmp_path / "array.json").write_bytes(codecs.BOM_UTF8 + b" \n [" + json.dumps(ROWS)[1:].encode())
    (tmp_path / "t.txt").write_text("x\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    jsonl(tmp_path / "UP.JSONL")
    got = {}
    for name in ("a.jsonl", "lines.json", "array.json", "t.txt", "p.parquet", "UP.JSONL"):
        s = locate(name, base_dir=tmp_path)
        assert s.label == str(tmp_path / name) and s.path == tmp_path / name
        assert (s.name, s.config, s.split) == (None, None, None)
        got[name] = (s.kind, s.label.by_row)
    assert got == {
        "a.jsonl": ("jsonl", False),
        "lines.json": ("jsonl", False),
        "array.json": ("json", True),
        "t.txt": ("txt", False),
        "p.parquet": ("parquet", True),
        "UP.JSONL": ("jsonl", False),
    }


def test_an_unknown_file_type_and_a_file_asked_for_a_split(tmp_path):
    (tmp_path / "d.csv").write_text("a\n")
    (tmp_path / "README").write_text("a\n")
    jsonl(tmp_path / "d.jsonl")
    with pytest.raises(SourceError) as err:
        locate(tmp_path / "d.csv")
    assert message(err) == (
        f"{str(tmp_path / 'd.csv')!r} has an unknown data file type '.csv'; expected one of "
        "('.jsonl', '.json', '.txt', '.parquet', '.arrow')"
    )
    with pytest.raises(SourceError) as err:
        locate(tmp_path / "README")
    assert "has an unknown data file type '(no suffix)'; expected" in message(err)
    with pytest.raises(SourceError) as err:
        locate("d.jsonl", base_dir=tmp_path, split="test")
    assert message(err) == (
        f"{str(tmp_path / 'd.jsonl')!r} is a file, which has no splits (split 'test' was asked for); "
        "splits are those of save_to_disk folders and hub ids"
    )


def test_a_split_in_the_name_against_another_split_asked_for(tmp_path):
    with pytest.raises(SourceError) as err:
        locate("org/name[test]", base_dir=tmp_path, split="train")
    assert message(err) == "'org/name[test]' names split 'test', but split 'train' was asked for"
    # the same split twice is no conflict
    assert locate("org/name[test]", base_dir=tmp_path, split="test").split == "test"
    # slices of a hub split stay in the split
    assert locate("org/name[train[:100]]", base_dir=tmp_path).split == "train[:100]"


def test_hub_ids_their_labels_and_what_cannot_be_one(tmp_path):
    s = locate("org/name", base_dir=tmp_path)
    assert s == Source(
        "hub", s.label, path=tmp_path / "org/name", name="org/name", config=None, split="train"
    )
    assert s.label == "org/name[train]" and s.label.by_row
    s = locate("gsm8k:main[test]", base_dir=tmp_path)
    assert (s.name, s.config, s.split, str(s.label)) == ("gsm8k", "main", "test", "gsm8k:main[test]")
    s = locate("org/name", base_dir=tmp_path, split="validation")
    assert str(s.label) == "org/name[validation]"
    # paths (a data suffix, a leading . / ~, two slashes) and names no hub id has are missing files
    for spec in ("a/b/c", "./x", "~/x", "x.JSONL", "x.parquet", "/abs/x", "-bad", "a b"):
        with pytest.raises(SourceNotFoundError):
            locate(spec, base_dir=tmp_path)


def test_a_missing_path_says_what_was_tried(tmp_path, monkeypatch):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SourceNotFoundError) as err:
        locate(missing)
    assert message(err) == f"{str(missing)!r} does not exist"
    with pytest.raises(SourceNotFoundError) as err:
        locate("nope.jsonl", base_dir=tmp_path / "r")
    tried = tmp_path / "r" / "nope.jsonl"
    assert message(err) == f"{str(tried)!r} does not exist (tried {tried})"
    # there relative to the working directory, not to the recipe
    jsonl(tmp_path / "d.jsonl")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    with pytest.raises(SourceNotFoundError) as err:
        locate("d.jsonl", base_dir=tmp_path / "r")
    tried = tmp_path / "r" / "d.jsonl"
    assert message(err) == (
        f"{str(tried)!r} does not exist (tried {tried}); {tmp_path / 'd.jsonl'} exists relative to the "
        "current directory, but paths in a recipe are relative to the recipe's folder: write it "
        "relative to the recipe, or absolute"
    )
    # no recipe folder: no such hint
    with pytest.raises(SourceNotFoundError) as err:
        locate("e.jsonl")
    assert message(err) == "'e.jsonl' does not exist"


def test_save_to_disk_folders_their_splits_and_refusals(tmp_path):
    dd = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    ).save_to_disk(str(dd))
    s = locate(dd)
    assert (s.kind, s.split, str(s.label), s.label.by_row, s.path) == (
        "disk",
        "train",
        f"{dd}[train]",
        True,
        dd,
    )
    with pytest.raises(SourceError) as err:
        locate(dd, split="dev")
    assert (
        message(err)
        == f"{str(dd)!r} has no split 'dev'; its splits are ['train', 'test'] (pick one with `dd[SPLIT]`)"
    )
    assert count_rows(locate(dd)) == 3 and count_rows(locate(dd, split="test")) == 1
    single = tmp_path / "single"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(single))
    s = locate(single)
    assert (s.kind, s.split, str(s.label), s.label.by_row) == ("disk", None, str(single), True)
    assert count_rows(s) == 3
    with pytest.raises(SourceError) as err:
        locate(single, split="test")
    assert message(err) == f"{str(single)!r} is a single Dataset (no splits), but split 'test' was asked for"
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "state.json").write_text("{}")  # state.json without dataset_info.json
    with pytest.raises(SourceError) as err:
        locate(tmp_path / "half")
    assert message(err) == (
        f"{str(tmp_path / 'half')!r} is a folder but not one `datasets` wrote with save_to_disk (no "
        "dataset_dict.json, or state.json and dataset_info.json); name a data file inside it instead"
    )


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"splits": "train"}', "has a dataset_dict.json with no list of splits"),
        ("{}", "has a dataset_dict.json with no list of splits"),
        ('["train"]', "has a dataset_dict.json that cannot be read: 'list' object has no attribute 'get'"),
        (
            "{not json",
            "has a dataset_dict.json that cannot be read: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
    ],
)
def test_an_unreadable_dataset_dict(tmp_path, content, problem):
    (tmp_path / "dataset_dict.json").write_text(content)
    with pytest.raises(SourceError) as err:
        locate(tmp_path)
    assert message(err) == f"{str(tmp_path)!r} {problem}"


def test_split_names_are_strings(tmp_path):
    (tmp_path / "dataset_dict.json").write_text('{"splits": [1, "b"]}')
    assert sources._splits(tmp_path) == ["1", "b"]


def test_check_source_says_why_or_none(tmp_path, monkeypatch):
    jsonl(tmp_path / "d.jsonl")
    assert check_source("d.jsonl", tmp_path) is None
    assert (
        check_source("nope.jsonl", tmp_path)
        == f"{str(tmp_path / 'nope.jsonl')!r} does not exist (tried {tmp_path / 'nope.jsonl'})"
    )
    monkeypatch.setattr(sources, "check_hub", lambda source: "is away")
    assert check_source("org/name", tmp_path, split="test") == "'org/name[test]' is away"
    monkeypatch.setattr(sources, "check_hub", lambda source: None)
    assert check_source("org/name", tmp_path) is None
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.R_OK)
    assert (
        check_source("d.jsonl", tmp_path)
        == f"{str(tmp_path / 'd.jsonl')!r} is not readable (permission denied)"
    )


def test_count_rows_of_each_kind(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n\n  \n{"a": 2}\n{"a": 3}')
    (tmp_path / "t.txt").write_text("x\n\ny\n")
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    table = pa.Table.from_pylist(ROWS[:2])
    with pa.ipc.new_file(tmp_path / "f.arrow", table.schema) as w:
        w.write_table(table)
    counts = {
        n: count_rows(locate(n, tmp_path)) for n in ("d.jsonl", "t.txt", "a.json", "p.parquet", "f.arrow")
    }
    assert counts == {"d.jsonl": 3, "t.txt": 2, "a.json": 3, "p.parquet": 3, "f.arrow": 2}
    assert count_rows(locate("org/name", tmp_path)) is None


def test_read_rows_raises_or_yields_a_bad_row(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(DataError) as err:
        list(read_rows("d.jsonl", tmp_path))
    assert (
        message(err) == f"{tmp_path / 'd.jsonl'}:2: field '<json>': invalid JSON: Expecting value at column 7"
    )
    rows = list(read_rows("d.jsonl", tmp_path, errors="yield"))
    assert [(n, r if isinstance(r, dict) else str(r)) for _, n, r in rows] == [
        (1, {"a": 1}),
        (2, message(err)),
        (3, {"a": 3}),
    ]
    # a Source from locate reads the same
    assert [r for _, _, r in read_rows(locate("d.jsonl", tmp_path), errors="yield")][0] == {"a": 1}


def test_text_rows_numbered_by_line(tmp_path):
    (tmp_path / "t.txt").write_bytes(codecs.BOM_UTF8 + b"first\r\n\n  \nsecond line\n\xff bad\nlast")
    rows = list(read_rows("t.txt", tmp_path, errors="yield"))
    label = str(tmp_path / "t.txt")
    assert [(str(lab), n) for lab, n, _ in rows] == [(label, 1), (label, 4), (label, 5), (label, 6)]
    assert [r for _, _, r in rows if isinstance(r, dict)] == [
        {"text": "first"},
        {"text": "second line"},
        {"text": "last"},
    ]
    assert str(rows[2][2]) == f"{label}:5: field '<bytes>': not UTF-8: byte 0xff at column 1"


def test_json_array_rows_and_their_errors(tmp_path):
    path = tmp_path / "a.json"
    label = str(path)
    path.write_text('[{"a": 1}, {"a": 2}]')
    assert [(n, r) for _, n, r in read_rows(path)] == [(1, {"a": 1}), (2, {"a": 2})]
    path.write_text("  [ ]  ")
    assert list(read_rows(path)) == []
    path.write_text('[\n{"a": 1}\n{"a": 2}]')
    with pytest.raises(DataError) as err:
        list(read_rows(path))
    assert (
        message(err)
        == f"{label}: row 2: field '<json>': invalid JSON: expected ',' or ']' after an element at line 3 column 1"
    )
    path.write_text('[{"a": 1},\n  {"a": 2}] x')
    with pytest.raises(DataError) as err:
        list(read_rows(path))
    assert (
        message(err)
        == f"{label}: row 3: field '<json>': invalid JSON: extra data after the array at line 2 column 12"
    )
    path.write_text('[{"a": 1},\n {"a" 2}]')
    with pytest.raises(DataError) as err:
        list(read_rows(path, errors="yield"))
    assert (
        message(err)
        == f"{label}: row 2: field '<json>': invalid JSON: Expecting ':' delimiter at line 2 column 7"
    )
    path.write_text('[{"a": 1, "a": 2}, {"b": 3}]')
    rows = list(read_rows(path, errors="yield"))
    assert (
        str(rows[0][2])
        == f"{label}: row 1: field 'a': appears twice in the object; the last value would silently win"
    )
    assert rows[1][1:] == (2, {"b": 3})
    path.write_bytes(b'[{"a": 1},\n{"a": "\xfe"}]')
    with pytest.raises(SourceError) as err:
        list(read_rows(path))
    assert message(err) == f"{label!r} is not UTF-8: byte 0xfe on line 2"


def test_unreadable_tables(tmp_path):
    (tmp_path / "p.parquet").write_bytes(b"not parquet at all")
    (tmp_path / "f.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(SourceError) as err:
        list(read_rows("p.parquet", tmp_path))
    assert message(err).startswith(f"{str(tmp_path / 'p.parquet')!r} cannot be read as parquet: ")
    with pytest.raises(SourceError) as err:
        list(read_rows("f.arrow", tmp_path))
    assert message(err).startswith(
        f"{str(tmp_path / 'f.arrow')!r} cannot be read as an Arrow IPC file or stream: "
    )


def test_arrow_rows_are_numbered_across_batches_and_lose_only_nested_nulls(tmp_path):
    rows = [
        {"top": None, "m": [{"role": "user", "content": "q", "x": None}], "d": {"k": None, "j": 1}},
        {"top": 1, "m": [{"role": "user", "content": "r", "x": 2}], "d": {"k": 2, "j": None}},
        {"top": 2, "m": [], "d": {"k": 3, "j": 4}},
    ]
    table = pa.Table.from_pylist(rows)
    path = tmp_path / "s.arrow"
    with pa.ipc.new_stream(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=1):
            w.write_batch(batch)
    got = list(read_rows(path))
    assert [n for _, n, _ in got] == [1, 2, 3]
    assert [r for _, _, r in got] == [
        {"top": None, "m": [{"role": "user", "content": "q"}], "d": {"j": 1}},
        {"top": 1, "m": [{"role": "user", "content": "r", "x": 2}], "d": {"k": 2}},
        {"top": 2, "m": [], "d": {"k": 3, "j": 4}},
    ]


@pytest.mark.parametrize(
    "env, offline",
    [
        ({}, False),
        ({"HF_HUB_OFFLINE": ""}, False),
        ({"HF_HUB_OFFLINE": "0"}, False),
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_DATASETS_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "true"}, True),
    ],
)
def test_hub_offline(monkeypatch, env, offline):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert hub_offline() is offline


def test_check_hub_offline_and_online(monkeypatch, tmp_path):
    source = locate("org/name:cfg", tmp_path)
    calls = []

    def builder(name, config):
        calls.append((name, config))
        raise ConnectionError("no cache")

    monkeypatch.setattr(datasets, "load_dataset_builder", builder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert check_hub(source) == (
        f"is not a local file or folder (tried {tmp_path / 'org/name:cfg'}), and as a hub data set it is "
        "not in the local cache while HF_HUB_OFFLINE is set (ConnectionError: no cache)"
    )
    assert calls == [("org/name", "cfg")]
    monkeypatch.setattr(datasets, "load_dataset_builder", lambda name, config: object())
    assert check_hub(source) is None
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    monkeypatch.setattr(sources, "hub_reachable", lambda: False)
    assert check_hub(source) == (
        f"is not a local file or folder (tried {tmp_path / 'org/name:cfg'}), and the hub "
        "(http://hub.invalid) cannot be reached to load it as a data set (HF_HUB_OFFLINE=1 uses the local cache)"
    )
    monkeypatch.setattr(sources, "hub_reachable", lambda: True)
    assert check_hub(source) is None


def test_a_hub_data_set_that_cannot_be_had(monkeypatch, tmp_path):
    source = locate("org/name[dev]", tmp_path)
    monkeypatch.setattr(sources, "check_hub", lambda s: "is away")
    with pytest.raises(SourceNotFoundError) as err:
        list(read_rows(source))
    assert message(err) == "'org/name[dev]' is away"
    assert err.value.source == "org/name[dev]"

    def load_dataset(name, config, split):
        raise ValueError(f"Unknown split {split!r}")

    monkeypatch.setattr(sources, "check_hub", lambda s: None)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(SourceError) as err:
        list(read_rows(source))
    assert message(err) == "'org/name[dev]' cannot be loaded: Unknown split 'dev'"


def test_a_label_keeps_by_row_through_copies():
    label = SourceLabel("x", by_row=True)
    assert label.__getnewargs__() == ("x", True)
    assert SourceLabel("y", by_row=False).__getnewargs__() == ("y", False)


def test_json_error_positions_count_from_the_start_of_the_file(tmp_path):
    path = tmp_path / "a.json"
    label = str(path)
    # the line and column of the error, not of the end of the file, with a newline at offset 0
    path.write_text('\n[{"a": 1}\n{"a": 2}]\n\n\n')
    with pytest.raises(DataError) as err:
        list(read_rows(path))
    assert (
        message(err)
        == f"{label}: row 2: field '<json>': invalid JSON: expected ',' or ']' after an element at line 3 column 1"
    )
    path.write_text("\n[1 2]")
    with pytest.raises(DataError) as err:
        list(read_rows(path))
    assert (
        message(err)
        == f"{label}: row 2: field '<json>': invalid JSON: expected ',' or ']' after an element at line 2 column 4"
    )


def test_text_rows_keep_their_trailing_spaces(tmp_path):
    (tmp_path / "t.txt").write_text("a  \r\nbX\n")
    assert [r for _, _, r in read_rows("t.txt", tmp_path)] == [{"text": "a  "}, {"text": "bX"}]
