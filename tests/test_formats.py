"""Exact tests of `temper.data.formats`: every row refusal as the user reads it (`file:line: field
'...': problem`, whole), the Example each format gives, the one-format-per-file rule, the skip
report and the decode errors. Written against the mutants mutmut left alive (TESTING.md)."""

import json

import pytest

from temper.data.formats import (
    ROLES,
    DataError,
    Example,
    LoadReport,
    NoUsableRowsError,
    example_format,
    load_hf_dataset,
    load_jsonl,
    load_rows,
    parse_row,
    validate_rows,
)

U = {"role": "user", "content": "q"}


A = {"role": "assistant", "content": "a"}


S = {"role": "system", "content": "s"}


T = {"role": "tool", "content": "r"}


CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {}}}],
}


# (row, field, problem): the whole message is f"f.jsonl:7: field {field!r}: {problem}"
BAD = [
    ([1], "<row>", "must be a JSON object, got list"),
    ("x", "<row>", "must be a JSON object, got str"),
    (
        {"other": 1, "b": 2},
        "<row>",
        "has none of 'messages', 'prompt'/'completion', 'text' (keys: ['b', 'other'])",
    ),
    ({"messages": []}, "messages", "must be a non-empty list of {role, content} messages"),
    ({"messages": "hi"}, "messages", "must be a non-empty list of {role, content} messages"),
    ({"messages": [U, "x"]}, "messages[1]", "must be an object with role and content"),
    (
        {"messages": [U, {"role": "bot", "content": "a"}]},
        "messages[1].role",
        "got 'bot', expected one of ('system', 'user', 'assistant', 'tool')",
    ),
    (
        {"messages": [U, {"role": "assistant", "content": 3}]},
        "messages[1].content",
        "must be a string, got int",
    ),
    (
        {"messages": [U, {"role": "assistant"}]},
        "messages[1].content",
        "must be a string, got NoneType (only an assistant turn with tool_calls may have none)",
    ),
    (
        {"messages": [U, {"role": "assistant", "content": "a", "tool_calls": []}]},
        "messages[1].tool_calls",
        "must be a non-empty list",
    ),
    (
        {"messages": [U, {"role": "assistant", "content": "a", "tool_calls": {"x": 1}}]},
        "messages[1].tool_calls",
        "must be a non-empty list",
    ),
    (
        {"messages": [U, {"role": "assistant", "content": " \n"}]},
        "messages[1].content",
        "is empty: an assistant turn with no content and no tool_calls trains on the end token alone",
    ),
    (
        {"messages": [U, T, A]},
        "messages[1].role",
        "a 'tool' message must follow the assistant turn that called the tool, not 'user'",
    ),
    (
        {"messages": [T, A]},
        "messages[0].role",
        "a 'tool' message must follow the assistant turn that called the tool, not 'nothing'",
    ),
    (
        {"messages": [S, A]},
        "messages[1].role",
        "the conversation opens with an assistant turn, which has nothing to condition on; add the user turn it answers",
    ),
    ({"messages": [S, U]}, "messages", "has no assistant turn to train on"),
    ({"prompt": "p"}, "completion", "missing (prompt-completion rows need both)"),
    ({"completion": "c"}, "prompt", "missing (prompt-completion rows need both)"),
    (
        {"prompt": "p", "completion": [A]},
        "completion",
        "prompt and completion must both be strings or both be message lists",
    ),
    (
        {"prompt": [U], "completion": "c"},
        "completion",
        "prompt and completion must both be strings or both be message lists",
    ),
    ({"prompt": "p", "completion": ""}, "completion", "is empty"),
    ({"prompt": [], "completion": [A]}, "prompt", "must be a non-empty list of {role, content} messages"),
    ({"prompt": [U], "completion": [U]}, "completion", "has no assistant turn to train on"),
    (
        {"prompt": [S], "completion": [A]},
        "completion[0].role",
        "the conversation opens with an assistant turn, which has nothing to condition on; add the user turn it answers",
    ),
    (
        {"prompt": [S, S], "completion": [A]},
        "completion[0].role",
        "the conversation opens with an assistant turn, which has nothing to condition on; add the user turn it answers",
    ),
    (
        {"prompt": [A], "completion": [A]},
        "prompt[0].role",
        "the conversation opens with an assistant turn, which has nothing to condition on; add the user turn it answers",
    ),
    (
        {"prompt": [U], "completion": [{"role": "bot", "content": "x"}]},
        "completion[0].role",
        f"got 'bot', expected one of {ROLES}",
    ),
    ({"text": 5}, "text", "must be a string, got int"),
    ({"text": "  \n"}, "text", "is empty"),
]


@pytest.mark.parametrize("row, field, problem", BAD)
def test_each_refusal_whole(row, field, problem):
    with pytest.raises(DataError) as err:
        parse_row(row, "f.jsonl", 7)
    assert str(err.value) == f"f.jsonl:7: field {field!r}: {problem}"
    assert (err.value.source, err.value.line, err.value.field, err.value.problem) == (
        "f.jsonl",
        7,
        field,
        problem,
    )


def test_what_a_tool_message_may_follow():
    for messages in (
        [U, CALL, T, A],
        [U, CALL, T, T, A],
        [U, {"role": "assistant", "content": "call w()"}, T, A],
    ):
        assert parse_row({"messages": messages}, "f", 1).messages == messages
    # a tool result opening the completion answers the prompt's last assistant turn
    ex = parse_row({"prompt": [U, CALL], "completion": [T, A]}, "f", 1)
    assert ex.prompt == [U, CALL] and ex.completion == [T, A]
    with pytest.raises(DataError, match="not 'user'"):
        parse_row({"prompt": [U], "completion": [T, A]}, "f", 1)


def test_the_example_of_each_format():
    assert parse_row({"messages": [S, U, A], "x": 1}, "f", 3) == Example("f", 3, messages=[S, U, A])
    assert parse_row({"prompt": "p", "completion": "c"}, "f", 4) == Example(
        "f", 4, prompt="p", completion="c"
    )
    assert parse_row({"prompt": [U], "completion": [A]}, "f", 5) == Example(
        "f", 5, prompt=[U], completion=[A]
    )
    assert parse_row({"text": "t"}, "f", 6) == Example("f", 6, text="t")
    # messages wins over the other keys, prompt/completion over text
    assert parse_row({"messages": [U, A], "text": 1}, "f", 1).messages == [U, A]
    assert parse_row({"prompt": "p", "completion": "c", "text": 1}, "f", 1).prompt == "p"
    # an empty prompt string is allowed (the completion is what trains)
    assert parse_row({"prompt": "", "completion": "c"}, "f", 1).completion == "c"
    # an assistant turn that only calls a tool is not empty
    assert parse_row({"messages": [U, CALL, T, A]}, "f", 1).messages[1] is CALL


def test_the_format_each_example_has():
    def fmt(row):
        return example_format(parse_row(row, "f", 1))

    assert fmt({"messages": [U, A], "prompt": "p"}) == "messages"  # messages wins
    assert fmt({"prompt": "p", "completion": "c", "text": "t"}) == "prompt/completion (text)"
    assert fmt({"prompt": [U], "completion": [A]}) == "prompt/completion (messages)"
    assert fmt({"text": "t"}) == "text"


def test_one_format_per_file():
    rows = [(1, {"text": "a"}), (2, {"text": "b"}), (3, {"prompt": "p", "completion": "c"})]
    with pytest.raises(DataError) as err:
        validate_rows(rows, "f.jsonl")
    assert str(err.value) == (
        "f.jsonl:3: field '<row>': is a prompt/completion (text) row but line 1 is a text row; keep one format per file"
    )
    # the first GOOD row sets the format
    rows = [
        (1, {"text": ""}),
        (2, {"prompt": "p", "completion": "c"}),
        (3, {"prompt": [U], "completion": [A]}),
    ]
    examples, report = validate_rows(rows, "f.jsonl", skip_bad_rows=True)
    assert [e.line for e in examples] == [2]
    assert report == LoadReport(
        rows=3,
        skipped=2,
        errors=[
            "f.jsonl:1: field 'text': is empty",
            "f.jsonl:3: field '<row>': is a prompt/completion (messages) row but line 2 is a prompt/completion (text) row; keep one format per file",
        ],
    )


def test_bad_rows_raise_unless_skipped_and_the_report_keeps_five_messages():
    rows = [(i, {"text": ""}) for i in range(1, 8)] + [(8, {"text": "ok"})]
    with pytest.raises(DataError, match="f:1: field 'text'"):
        validate_rows(rows, "f")
    examples, report = validate_rows(rows, "f", True)
    assert examples == [Example("f", 8, text="ok")]
    assert (report.rows, report.skipped) == (8, 7)
    assert report.errors == [f"f:{i}: field 'text': is empty" for i in range(1, 6)]
    # a decode error given in place of a row is a bad row like any other
    err = DataError("f", 2, "<json>", "invalid JSON")
    examples, report = validate_rows([(1, {"text": "a"}), (2, err)], "f", skip_bad_rows=True)
    assert report.errors == ["f:2: field '<json>': invalid JSON"] and len(examples) == 1
    assert LoadReport() == LoadReport(0, 0, [])


def test_decode_errors_of_a_jsonl_file(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        b'{"text": "a"}\r\n{"text": "b", "text": "c"}\n{"text": "\xff"}\n{"text": \n{"text": "ok"}\r\n'
    )
    examples, report = load_jsonl(path, skip_bad_rows=True)
    assert [(e.line, e.text) for e in examples] == [(1, "a"), (5, "ok")]
    assert report.errors == [
        f"{path}:2: field 'text': appears twice in the object; the last value would silently win",
        f"{path}:3: field '<bytes>': not UTF-8: byte 0xff at column 11",
        f"{path}:4: field '<json>': invalid JSON: Expecting value at column 10",
    ]


def test_load_rows_resolves_against_base_dir(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
    examples, report = load_rows("d.jsonl", base_dir=tmp_path)
    assert examples == [Example(str(tmp_path / "d.jsonl"), 1, text="a")] and report.rows == 1


def test_an_in_memory_data_set_and_a_plain_list():
    examples, _ = load_hf_dataset([{"text": "a"}, {"text": "b"}], name="mem")
    assert [(e.source, e.line, e.source.by_row) for e in examples] == [("mem", 1, True), ("mem", 2, True)]
    with pytest.raises(DataError) as err:
        load_hf_dataset([{"text": "a"}, {"text": ""}])
    assert str(err.value) == "dataset: row 2: field 'text': is empty"
    examples, report = load_hf_dataset([{"text": ""}, {"text": "b"}], skip_bad_rows=True)
    assert [e.line for e in examples] == [2] and report.skipped == 1


def test_no_usable_rows_message():
    err = NoUsableRowsError(["a.jsonl", "b.jsonl"], "all rows were skipped")
    assert str(err) == "no usable training rows in a.jsonl, b.jsonl: all rows were skipped"
    assert (err.source, err.line, err.field, err.problem) == (
        "a.jsonl, b.jsonl",
        0,
        "<data>",
        "all rows were skipped",
    )
    assert str(NoUsableRowsError([], "x")) == "no usable training rows in no sources: x"


def test_load_rows_reads_the_split_asked_for(tmp_path):
    import datasets

    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"text": "a"}, {"text": "b"}]),
            "test": datasets.Dataset.from_list([{"text": "c"}]),
        }
    ).save_to_disk(str(tmp_path / "dd"))
    examples, _ = load_rows("dd", base_dir=tmp_path, split="test")
    assert [(e.source, e.text) for e in examples] == [(f"{tmp_path / 'dd'}[test]", "c")]


def test_load_jsonl_raises_on_a_bad_row_by_default(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(DataError, match="d.jsonl:1: field 'text': is empty"):
        load_jsonl(tmp_path / "d.jsonl")
