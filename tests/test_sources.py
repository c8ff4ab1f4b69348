"""Every data format through one reader: the same rows give the same Examples, and a bad row is
named by file, line or row, and field in each."""

import codecs
import json
import os
import time
from dataclasses import replace

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from temper.data import DataError, load_hf_dataset, load_rows, read_rows, sources
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

CHAT = [
    {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]},
    {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "sunny, é ✓"},
        ]
    },
    {"messages": [{"role": "user", "content": "3*3"}, {"role": "assistant", "content": "9"}]},
]


def write(fmt, rows, folder, name="d"):
    """`rows` in format `fmt` under `folder`; returns the spec that names them."""
    if fmt == "jsonl":
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "json":
        path = folder / f"{name}.json"
        path.write_text(json.dumps(rows, ensure_ascii=False))
    elif fmt == "json_indented":
        path = folder / f"{name}.json"
        path.write_text(json.dumps(rows, indent=2))
    elif fmt == "parquet":
        path = folder / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "arrow":
        path = folder / f"{name}.arrow"
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    elif fmt == "arrow_stream":  # the IPC stream format, as `datasets` writes its .arrow files
        path = folder / f"{name}.arrow"
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_stream(path, table.schema) as writer:
            writer.write_table(table)
    elif fmt == "disk":
        path = folder / name
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    elif fmt == "disk_dict":
        path = folder / name
        datasets.DatasetDict(
            {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
        ).save_to_disk(str(path))
    else:
        raise ValueError(fmt)
    return str(path)


FORMATS = ["jsonl", "json", "json_indented", "parquet", "arrow", "arrow_stream", "disk", "disk_dict"]


def strip(examples):
    return [replace(e, source="") for e in examples]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gives_the_jsonl_examples(tmp_path, fmt):
    expected, _ = load_rows(write("jsonl", CHAT, tmp_path, "ref"))
    examples, report = load_rows(write(fmt, CHAT, tmp_path))
    assert strip(examples) == strip(expected)
    # Arrow gives every message the union of the keys; the null ones are gone again
    assert "tool_calls" not in examples[0].messages[1]
    assert report.rows == 3 and report.skipped == 0
    assert [e.line for e in examples] == [1, 2, 3]


def test_prompt_completion_and_text_rows_through_parquet(tmp_path):
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    assert strip(load_rows(write("parquet", rows, tmp_path))[0]) == strip(
        load_rows(write("jsonl", rows, tmp_path))[0]
    )
    text = [{"text": "x y"}, {"text": "z"}]
    assert [e.text for e in load_rows(write("disk", text, tmp_path, "t"))[0]] == ["x y", "z"]


@pytest.mark.parametrize(
    "fmt, where",
    [
        ("jsonl", "d.jsonl:3: field"),
        ("json", "d.json: row 3: field"),
        ("parquet", "d.parquet: row 3: field"),
        ("disk_dict", "d[train]: row 3: field"),
    ],
)
def test_a_bad_row_is_named_by_file_row_and_field(tmp_path, fmt, where):
    # (a role outside the known ones: a content of another type cannot share an Arrow column)
    bad = CHAT[:2] + [{"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "5"}]}]
    spec = write(fmt, bad, tmp_path)
    with pytest.raises(DataError) as err:
        load_rows(spec)
    assert err.value.line == 3 and err.value.field == "messages[1].role"
    assert f"{where} 'messages[1].role': got 'robot'" in str(err.value)
    rows, report = load_rows(spec, skip_bad_rows=True)
    assert [r.line for r in rows] == [1, 2] and report.skipped == 1


def test_read_rows_yields_label_number_and_row(tmp_path):
    spec = write("parquet", CHAT, tmp_path)
    rows = list(read_rows("d.parquet", base_dir=tmp_path))
    assert [(label, n) for label, n, _ in rows] == [(spec, 1), (spec, 2), (spec, 3)]
    assert rows[0][2] == CHAT[0]


def test_datasetdict_split_selection(tmp_path):
    spec = write("disk_dict", CHAT, tmp_path)
    assert len(list(read_rows(spec))) == 3  # train by default
    test = list(read_rows(spec, split="test"))
    assert len(test) == 1 and test[0][0] == f"{spec}[test]"
    assert len(list(read_rows(f"{spec}[test]"))) == 1  # the split named inside the string
    with pytest.raises(SourceError, match=r"has no split 'validation'; its splits are \['train', 'test'\]"):
        locate(spec, split="validation")
    with pytest.raises(SourceError, match=r"is a file, which has no splits \(split 'test' was asked for\)"):
        locate(write("parquet", CHAT, tmp_path) + "[test]")
    single = write("disk", CHAT, tmp_path, "single")
    with pytest.raises(SourceError, match="single Dataset"):
        locate(single, split="test")


def test_a_folder_that_is_not_a_saved_dataset_is_refused(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(SourceError, match="not one `datasets` wrote with save_to_disk"):
        locate(tmp_path / "plain")


def test_json_array_rows_duplicate_keys_and_invalid_json(tmp_path):
    path = tmp_path / "a.json"
    good = json.dumps(CHAT[0])
    path.write_text(f'[{good},\n {{"prompt": "a", "prompt": "b"}},\n {good}]')
    with pytest.raises(DataError, match=r"a.json: row 2: field 'prompt': appears twice"):
        load_rows(path)
    rows, report = load_rows(path, skip_bad_rows=True)
    assert [r.line for r in rows] == [1, 3] and report.skipped == 1
    path.write_text(f"[{good},\n {good},\n {{not json}}]")
    with pytest.raises(DataError, match=r"a.json: row 3: field '<json>': invalid JSON: .* at line 3"):
        load_rows(path, skip_bad_rows=True)  # the rest of the array cannot be located: not skippable
    path.write_text(f"[{good}] trailing")
    with pytest.raises(DataError, match="extra data after the array"):
        load_rows(path)
    # a .json file of one object per line is JSON Lines, numbered by line
    path.write_text(f"{good}\n{good}\n")
    assert [r.line for r in load_rows(path)[0]] == [1, 2]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "json_indented"])
def test_a_byte_order_mark_is_dropped(tmp_path, fmt):
    spec = write(fmt, CHAT, tmp_path)
    with open(spec, "rb") as f:
        data = f.read()
    with open(spec, "wb") as f:
        f.write(codecs.BOM_UTF8 + data)
    assert len(load_rows(spec)[0]) == 3


def test_load_hf_dataset_reads_like_the_saved_dataset(tmp_path):
    examples, _ = load_hf_dataset(datasets.Dataset.from_list(CHAT), name="mem")
    assert strip(examples) == strip(load_rows(write("jsonl", CHAT, tmp_path))[0])
    bad = datasets.Dataset.from_list([{"messages": [{"role": "x", "content": "a"}]}])
    with pytest.raises(DataError, match=r"mem: row 1: field 'messages\[0\].role'"):
        load_hf_dataset(bad, "mem")


def test_missing_paths_and_unknown_types(tmp_path, monkeypatch):
    with pytest.raises(SourceNotFoundError, match=r"does not exist \(tried .*nope.parquet\)"):
        locate("nope.parquet", base_dir=tmp_path)
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match="unknown data file type '.csv'"):
        locate(tmp_path / "d.csv")
    # a file next to the working directory but not next to the recipe: which was tried is said
    recipe_dir = tmp_path / "recipes"
    recipe_dir.mkdir()
    write("jsonl", CHAT, tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceNotFoundError) as err:
        locate("d.jsonl", base_dir=recipe_dir)
    assert str(recipe_dir / "d.jsonl") in str(err.value)
    assert f"{tmp_path / 'd.jsonl'} exists relative to the current directory" in str(err.value)


def test_a_hub_id_offline_and_not_cached_fails_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    source = locate("someone/no-such-dataset-xyz", base_dir=tmp_path)
    assert (source.kind, source.name, source.split) == ("hub", "someone/no-such-dataset-xyz", "train")
    assert locate("org/name:main[test]").config == "main"
    start = time.perf_counter()
    with pytest.raises(SourceNotFoundError, match="not in the local cache while HF_HUB_OFFLINE is set"):
        list(read_rows("someone/no-such-dataset-xyz", base_dir=tmp_path))
    assert time.perf_counter() - start < 60  # no retries (minutes); generous, for a busy machine


def test_every_format_through_the_sft_loader_gives_the_same_examples(tmp_path):
    from temper.stages.context import StageContext
    from temper.stages.sft import SFTStage, sft_examples

    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={}, task_options={})
    rows = CHAT * 3  # enough rows that the seeded shuffle moves them
    seen = []
    for fmt in FORMATS:
        folder = tmp_path / fmt
        folder.mkdir()
        spec = write(fmt, rows, folder)
        stage = SFTStage(kind="sft", data={"files": [spec], "eval_files": [spec]})
        train, held_out, _ = sft_examples(stage, ctx)
        seen.append((fmt, strip(train), strip(held_out)))
    for fmt, train, held_out in seen[1:]:
        assert (train, held_out) == seen[0][1:], fmt
    assert len(seen[0][1]) == len(seen[0][2]) == 9


def test_a_row_label_survives_pickle_and_deepcopy(tmp_path):
    import copy
    import pickle

    (example,) = load_rows(write("parquet", CHAT[:1], tmp_path))[0]
    for again in (pickle.loads(pickle.dumps(example)), copy.deepcopy(example)):
        assert again == example and again.source.by_row


def test_a_hub_id_loads_through_datasets_like_the_other_forms(tmp_path, monkeypatch):
    from temper.data import sources

    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(CHAT)

    monkeypatch.setattr(sources, "check_hub", lambda source: None)  # as if online or cached
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    examples, _ = load_rows("org/chats:short[test]", base_dir=tmp_path)
    assert calls == [("org/chats", "short", "test")]
    assert strip(examples) == strip(load_rows(write("jsonl", CHAT, tmp_path))[0])
    assert examples[0].source == "org/chats:short[test]" and examples[0].source.by_row


# ---- exact cases, folded in from test_sources_exact.py -----------------------------------------
# Exact tests of `temper.data.sources`: every refusal's whole message (what a user reads, with
# the path and the option it names), the kind, label and numbering of each form, and the row counts.
# Written against the mutants mutmut left alive (TESTING.md).


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
