"""Bad training data is refused before work starts, one line naming file, line and field, and each
kind is skippable with `skip_bad_rows`; a template whose assistant header merges into the answer's
first token is refused instead of silently never training that token."""

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from temper.data import DataError, build_sequences, load_jsonl, parse_row, tokenize_example
from temper.data.chat import IGNORE, prompt_ids
from temper.data.dataset import require_sequences
from temper.data.formats import Example, NoUsableRowsError

GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
U, A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}


def _line(row) -> bytes:
    return row if isinstance(row, bytes) else json.dumps(row).encode()


# (name, bad line as a row or raw bytes, field the error must name[, the file's good rows])
CASES = [
    ("empty assistant", {"messages": [U, {"role": "assistant", "content": ""}]}, "messages[1].content"),
    ("blank assistant", {"messages": [U, {"role": "assistant", "content": " \n"}]}, "messages[1].content"),
    (
        "empty assistant completion",
        {"prompt": [U], "completion": [{"role": "assistant", "content": ""}]},
        "completion[0].content",
    ),
    ("lone assistant", {"messages": [A]}, "messages[0].role"),
    ("system then assistant", {"messages": [{"role": "system", "content": "s"}, A]}, "messages[1].role"),
    ("tool first", {"messages": [{"role": "tool", "content": "t"}, U, A]}, "messages[0].role"),
    ("tool after user", {"messages": [U, {"role": "tool", "content": "t"}, A]}, "messages[1].role"),
    (
        "tool opening a completion after a user prompt",
        {"prompt": [U], "completion": [{"role": "tool", "content": "t"}, A]},
        "completion[0].role",
    ),
    (
        "empty tool_calls",
        {"messages": [U, {"role": "assistant", "content": "", "tool_calls": []}]},
        "messages[1].tool_calls",
    ),
    ("duplicate key", b'{"messages": [{"role": "user", "content": "q"}], "messages": []}', "messages"),
    (
        "duplicate nested key",
        b'{"messages": [{"role": "user", "role": "assistant", "content": "a"}]}',
        "role",
    ),
    ("mixed formats: prompt/completion", {"prompt": "q", "completion": "a"}, "<row>"),
    ("mixed formats: text", {"text": "abc"}, "<row>"),
    ("mixed formats: chat prompt/completion", {"prompt": [U], "completion": [A]}, "<row>"),
    ("non-UTF-8 byte", b'{"messages": [{"role": "user", "content": "q\xff"}]}', "<bytes>"),
    ("latin-1 text", '{"text": "caf\u00e9"}'.encode("latin-1"), "<bytes>"),
    ("invalid JSON", b'{"messages": [', "<json>"),
    ("not an object", b"[1, 2]", "<row>"),
    ("empty text row", {"text": ""}, "text", {"text": "abc"}),
    ("blank text row", {"text": "  "}, "text", {"text": "abc"}),
    (
        "chat completion among text completions",
        {"prompt": [U], "completion": [A]},
        "<row>",
        {"prompt": "q", "completion": "a"},
    ),
    ("messages among text rows", GOOD, "<row>", {"text": "abc"}),
]


@pytest.mark.parametrize(
    ("name", "bad", "field", "first"), [(*c, GOOD)[:4] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_row_names_file_line_field_and_is_skippable(tmp_path, name, bad, field, first):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join([_line(first), b"", _line(bad), _line(first)]) + b"\n")
    with pytest.raises(DataError) as err:
        load_jsonl(path)
    assert (err.value.source, err.value.line, err.value.field) == (str(path), 3, field)
    assert str(err.value).startswith(f"{path}:3: field {field!r}: ")
    assert "\n" not in str(err.value)
    rows, report = load_jsonl(path, skip_bad_rows=True)
    assert [r.line for r in rows] == [1, 4]
    assert (report.rows, report.skipped) == (3, 1)
    assert report.errors == [str(err.value)]


def test_good_tool_turns_and_tool_calls_are_accepted(tmp_path):
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f"}}],
    }
    rows = [
        {"messages": [U, call, {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, A]},
        {"messages": [{"role": "system", "content": "s"}, U, A, {"role": "tool", "content": "t"}, A]},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r.line for r in load_jsonl(path)[0]] == [1, 2]
    chat = {"prompt": [U, A], "completion": [{"role": "tool", "content": "t"}, A]}
    assert parse_row(chat, "x", 1).completion[1] == A  # a tool result answering the prompt's call


def test_byte_order_mark_is_accepted(tmp_path):
    for name, body in (("d.jsonl", json.dumps(GOOD) + "\n"), ("d.txt", "first line\nsecond\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + body.encode())
        rows, report = load_jsonl(path)
        assert len(rows) == report.rows and report.skipped == 0
        assert (
            rows[0].messages == GOOD["messages"] if name.endswith("jsonl") else rows[0].text == "first line"
        )


def test_non_utf8_line_in_a_text_file_is_located_and_skippable(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"good\n\xc3(bad\nalso good\n")
    with pytest.raises(DataError, match=r"corpus.txt:2: field '<bytes>': not UTF-8: byte 0xc3 at column 1"):
        load_jsonl(path)
    rows, report = load_jsonl(path, skip_bad_rows=True)
    assert [r.text for r in rows] == ["good", "also good"] and report.skipped == 1


def test_zero_usable_rows_names_files_and_where_rows_went(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    long = {"messages": [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y"}]}
    path.write_text(json.dumps(long) + "\n{oops\n" + json.dumps(long) + "\n")
    rows, report = load_jsonl(path, skip_bad_rows=True)
    seqs, stats = build_sequences(tokenizer, rows, max_len=16)
    assert seqs == [] and (stats.dropped, stats.empty) == (2, 0)
    with pytest.raises(NoUsableRowsError) as err:
        require_sequences(seqs, stats, [str(path)], report.skipped, max_len=16)
    assert str(err.value) == (
        f"no usable training rows in {path}: 3 rows read: 1 malformed (skipped), 0 with nothing to "
        "train on, 2 longer than max_len=16 (nothing supervised left after truncation)"
    )
    assert isinstance(err.value, DataError)  # the CLI prints it as one line, no traceback
    seqs, stats = build_sequences(tokenizer, rows, max_len=64)
    require_sequences(seqs, stats, [str(path)], report.skipped, max_len=64)  # usable: no error
    # a row built in code (as a task's demonstration is) can still be empty: counted apart
    seqs, stats = build_sequences(tokenizer, [Example("task:t:train", 1, text="")], max_len=16)
    with pytest.raises(
        NoUsableRowsError,
        match=r"in task:t: 1 rows read: 0 malformed \(skipped\), 1 with nothing to train on, 0 longer",
    ):
        require_sequences(seqs, stats, ["task:t"], 0, max_len=16)


# A "user's" BPE tokenizer, trained here (no download), and a plain template whose assistant
# header either ends in a space (merges into the answer: `Ġ33`) or at a newline (does not).
TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'user' %}User: {{ m.content }}\n"
    "{% else %}Assistant:HEADER{{ m.content }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:HEADER{% endif %}"
)


def _bpe(header: str) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        show_progress=False,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(
        [f"User: what is {n}+3?\nAssistant: {n + 3}\n" for n in range(30, 40)] * 20, trainer
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", pad_token="<eos>")
    tok.chat_template = TEMPLATE.replace("HEADER", header)
    return tok


def test_bpe_template_whose_header_merges_into_the_answer_is_refused(tmp_path):
    tok = _bpe(" ")
    assert "Ġ33" in tok.get_vocab()  # the merge this test is about exists
    ex = parse_row(
        {"messages": [{"role": "user", "content": "what is 30+3?"}, {"role": "assistant", "content": "33"}]},
        "d.jsonl",
        7,
    )
    with pytest.raises(DataError) as err:
        tokenize_example(tok, ex, 64)
    assert (err.value.source, err.value.line, err.value.field) == ("d.jsonl", 7, "<chat_template>")
    msg = str(err.value)
    assert "not training-compatible" in msg and "before message 1" in msg
    assert "ends in '\\nAssistant: ', whose last ' '" in msg
    assert "['Ġ']" in msg and "['Ġ33']" in msg


def test_bpe_template_with_a_token_boundary_supervises_exactly_the_answer():
    tok = _bpe("\n")
    ex = parse_row(
        {"messages": [{"role": "user", "content": "what is 30+3?"}, {"role": "assistant", "content": "33"}]},
        "d.jsonl",
        1,
    )
    t = tokenize_example(tok, ex, 64)
    supervised = [tok.convert_ids_to_tokens(i) for i, lab in zip(t.input_ids, t.labels) if lab != IGNORE]
    assert supervised == ["3", "3", "<eos>", "Ċ"]  # the answer, its end and the turn's newline
    prompt = prompt_ids(tok, ex.messages[:1])  # what a policy continues at inference
    assert t.input_ids[: len(prompt)] == prompt and all(lab == IGNORE for lab in t.labels[: len(prompt)])


def test_sft_with_zero_usable_rows_stops_before_training_with_one_line(tmp_path, tokenizer, nano, capsys):
    from temper.cli import main

    model = tmp_path / "model"
    nano.save_pretrained(model)
    tokenizer.save_pretrained(model)
    data = tmp_path / "d.jsonl"
    long = {"messages": [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y"}]}
    data.write_text(json.dumps(long) + '\n{"messages": [{"role": "assistant", "content": "hi"}]}\n')
    out = tmp_path / "out"
    argv = ["sft", "--model", str(model), "--out", str(out), "--data.files", str(data)]
    code = main(
        [
            *argv,
            "--data.skip_bad_rows",
            "true",
            "--max_len",
            "16",
            "--train.max_steps",
            "2",
            "--train.warmup_steps",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert f"no usable training rows in {data}: 2 rows read: 1 malformed (skipped)" in err
    assert "1 longer than max_len=16" in err
    assert not (out / "model").exists()
