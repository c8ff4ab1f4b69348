"""Every data format through one reader: the same rows give the same Examples, and a bad row is
named by file, line or row, and field in each."""

import codecs
import json
import time
from dataclasses import replace

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from temper.data import DataError, load_hf_dataset, load_rows, read_rows
from temper.data.sources import SourceError, SourceNotFoundError, locate

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
    assert time.perf_counter() - start < 10


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
