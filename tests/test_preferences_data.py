"""Preference data: TRL's paired and unpaired formats, the implicit prompt, errors at file:line:
field, every source form, and completion-only masks."""

import json

import pytest

from temper.data.chat import IGNORE, prompt_ids, render_ids
from temper.data.formats import DataError
from temper.data.preferences import (
    Labelled,
    Pair,
    load_preferences,
    mismatched,
    parse_preference,
    shared_prefix,
    tokenize_labelled,
    tokenize_pairs,
    unpair,
)

U = {"role": "user", "content": "What is 2+3?"}
A5 = {"role": "assistant", "content": "5"}
A6 = {"role": "assistant", "content": "6"}


def _write(tmp_path, rows, name="prefs.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_explicit_and_implicit_prompts():
    p = parse_preference({"prompt": "2+3=", "chosen": "5", "rejected": "6"}, "f", 1)
    assert (p.prompt, p.chosen, p.rejected) == ("2+3=", "5", "6")
    p = parse_preference({"chosen": [U, A5], "rejected": [U, A6]}, "f", 1)
    assert (p.prompt, p.chosen, p.rejected) == ([U], [A5], [A6])
    p = parse_preference({"chosen": "The sky is blue.", "rejected": "The sky is green."}, "f", 1)
    assert (p.prompt, p.chosen, p.rejected) == ("The sky is", " blue.", " green.")


@pytest.mark.parametrize(
    "row",
    [
        {"chosen": [U, A5], "rejected": [U, A6]},
        {
            "chosen": [{"role": "system", "content": "s"}, U, A5],
            "rejected": [{"role": "system", "content": "s"}, U, A6],
        },
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Paris, of course", "rejected": "Paris? No: Rome"},
    ],
)
def test_implicit_prompt_splits_as_trl(row):
    trl = pytest.importorskip("trl")
    expected = trl.extract_prompt(dict(row))
    k = shared_prefix(row["chosen"], row["rejected"])
    assert (row["chosen"][:k], row["chosen"][k:], row["rejected"][k:]) == (
        expected["prompt"],
        expected["chosen"],
        expected["rejected"],
    )


def test_unpaired_and_unpair():
    item = parse_preference({"prompt": [U], "completion": [A5], "label": True}, "f", 2)
    assert isinstance(item, Labelled) and item.desirable and item.completion == [A5]
    p1, p2 = Pair("f", 3, [U], [A5], [A6]), Pair("f", 4, "q", "a", "b")
    got = [(x.completion, x.desirable) for x in unpair([p1, item, p2])]
    # chosen of every pair, then rejected of every pair, as TRL: neighbours answer other prompts
    assert got == [([A5], True), ([A5], True), ("a", True), ([A6], False), ("b", False)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "q", "chosen": "a"}, "f.jsonl:4: field 'rejected': missing"),
        (
            {"prompt": [U], "chosen": [{"role": "bot", "content": "5"}], "rejected": [A6]},
            "field 'chosen[0].role': got 'bot'",
        ),
        (
            {"prompt": [U], "chosen": [A5], "rejected": [{"role": "assistant", "content": " "}]},
            "field 'rejected[0].content': is empty",
        ),
        (
            {"prompt": [U], "chosen": "5", "rejected": [A6]},
            "field 'chosen': prompt and chosen must both be strings",
        ),
        ({"prompt": "q", "chosen": "5", "rejected": "5"}, "field 'rejected': is identical to chosen"),
        (
            {"chosen": "abc", "rejected": "xyz"},
            "field 'prompt': missing, and chosen and rejected share no leading text",
        ),
        ({"chosen": [A5], "rejected": [U, A6]}, "share no leading messages"),
        (
            {"chosen": "5", "rejected": [A6]},
            "field 'rejected': chosen and rejected must both be strings or both",
        ),
        ({"prompt": "q", "completion": "a", "label": 1}, "field 'label': must be true or false"),
        ({"completion": "a", "label": True}, "field 'prompt': missing (unpaired rows"),
        ({"prompt": "q", "completion": ""}, "has neither 'chosen'/'rejected'"),
        (["a"], "field '<row>': must be a JSON object"),
    ],
)
def test_row_errors_name_line_and_field(row, message):
    with pytest.raises(DataError) as err:
        parse_preference(row, "f.jsonl", 4)
    assert message in str(err.value)
    assert str(err.value).startswith("f.jsonl:4: field ")


def test_file_errors_and_skipping(tmp_path):
    good = {"prompt": "q", "chosen": "a", "rejected": "b"}
    path = _write(tmp_path, [good, "{not json", {"prompt": "q", "completion": "a", "label": True}, good])
    with pytest.raises(DataError, match=r"prefs.jsonl:2: field '<json>': invalid JSON"):
        load_preferences(path)
    rows, report = load_preferences(path, skip_bad_rows=True)
    assert len(rows) == 2 and report.skipped == 2 and report.rows == 4
    assert (
        "prefs.jsonl:3: field '<row>': is a unpaired (text) row but line 1 is a paired (text) row"
        in report.errors[1]
    )


def test_relative_paths_and_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [
        {"prompt": [U], "chosen": [A5], "rejected": [A6]},
        {"prompt": [U], "chosen": [A5], "rejected": [A5]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    with pytest.raises(DataError, match=r"p.parquet: row 2: field 'rejected': is identical"):
        load_preferences("p.parquet", tmp_path)
    got, _ = load_preferences("p.parquet", tmp_path, skip_bad_rows=True)
    assert got[0].chosen == [A5] and got[0].prompt == [U]


def test_chat_pairs_train_on_the_completion_only(tokenizer):
    pair = Pair("f", 1, [U], [A5], [{"role": "assistant", "content": "66"}])
    [tp], stats = tokenize_pairs(tokenizer, [pair], max_len=128)
    prompt = prompt_ids(tokenizer, [U])
    for seq, answer in ((tp.chosen, A5), (tp.rejected, pair.rejected[0])):
        full = render_ids(tokenizer, [U, answer], add_generation_prompt=False)
        assert seq.input_ids == full
        trained = [i for i, label in enumerate(seq.labels) if label != IGNORE]
        assert trained[0] == len(prompt)  # the first completion token, nothing of the prompt
        assert [seq.input_ids[i] for i in trained] == [seq.labels[i] for i in trained]
        assert tokenizer.decode([seq.input_ids[i] for i in trained]).startswith(answer["content"])
    assert tp.chosen.input_ids[: len(prompt)] == tp.rejected.input_ids[: len(prompt)] == prompt
    assert stats.dropped == stats.truncated == 0


def test_text_pairs_end_with_eos_and_truncation_is_counted(tokenizer):
    pair = Pair("f", 1, "2+3=", "5", "6")
    [tp], _ = tokenize_pairs(tokenizer, [pair], max_len=64)
    q = tokenizer("2+3=", add_special_tokens=False)["input_ids"]
    five = tokenizer("5", add_special_tokens=False)["input_ids"]
    assert tp.chosen.input_ids == q + five + [tokenizer.eos_token_id]
    assert tp.chosen.labels == [IGNORE] * len(q) + five + [tokenizer.eos_token_id]
    # a prompt that fills max_len leaves a side with nothing to train on: the pair is dropped, counted
    long = Pair("f", 2, "1" * 80, "5", "6")
    got, stats = tokenize_pairs(tokenizer, [pair, long], max_len=len(q) + 1)
    assert len(got) == 1 and stats.dropped == 1 and stats.truncated == 4


def test_labelled_and_mismatched(tokenizer):
    items = [
        Labelled("f", 1, [U], [A5], True),
        Labelled("f", 2, [{"role": "user", "content": "1+1?"}], [A6], False),
    ]
    tokenized, stats = tokenize_labelled(tokenizer, items, max_len=128)
    assert (stats.desirable, stats.undesirable) == (1, 1)
    kl = mismatched(tokenized[1].sequence, tokenized[0].sequence)
    expected = render_ids(tokenizer, [items[1].prompt[0], A5], add_generation_prompt=False)
    assert kl.input_ids == expected  # prompt of the second, completion of the first
    assert sum(label != IGNORE for label in kl.labels) == sum(
        label != IGNORE for label in tokenized[0].sequence.labels
    )
