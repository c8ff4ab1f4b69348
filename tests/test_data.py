import json

import pytest
import torch

from fakes import EOS, Stub, codes
from temper.data import DataError, build_sequences, collate, load_jsonl, parse_row, tokenize_example
from temper.data.chat import IGNORE
from temper.data.dataset import DatasetStats, Sequence, _pack
from temper.data.formats import Example


def _supervised(tokenizer, tok):
    """The supervised tokens, as strings, in order."""
    return [tokenizer.convert_ids_to_tokens(i) for i, lab in zip(tok.input_ids, tok.labels) if lab != IGNORE]


def test_single_turn_mask_token_by_token(tokenizer):
    ex = parse_row(
        {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}, "x", 1
    )
    tok = tokenize_example(tokenizer, ex, 64)
    tokens = tokenizer.convert_ids_to_tokens(tok.input_ids)
    assert tokens == ["<|user|>", "1", "+", "1", "<|end|>", "<|assistant|>", "2", "<|end|>"]
    assert [lab != IGNORE for lab in tok.labels] == [False] * 6 + [True, True]
    assert [lab for lab in tok.labels if lab != IGNORE] == tok.input_ids[6:]


def test_multi_turn_supervises_every_assistant_turn_and_nothing_else(tokenizer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a3"},
    ]
    tok = tokenize_example(tokenizer, parse_row({"messages": messages}, "x", 1), 128)
    assert _supervised(tokenizer, tok) == ["a", "1", "<|end|>", "a", "2", "<|end|>", "a", "3", "<|end|>"]


def test_prompt_completion_formats(tokenizer):
    plain = tokenize_example(tokenizer, parse_row({"prompt": "2+2=", "completion": "4"}, "x", 1), 64)
    assert _supervised(tokenizer, plain) == ["4", "<|end|>"]
    chat = parse_row(
        {
            "prompt": [{"role": "user", "content": "q"}],
            "completion": [{"role": "assistant", "content": "ok"}],
        },
        "x",
        1,
    )
    assert _supervised(tokenizer, tokenize_example(tokenizer, chat, 64)) == ["o", "k", "<|end|>"]


def test_text_rows_supervise_everything(tokenizer):
    tok = tokenize_example(tokenizer, parse_row({"text": "ab"}, "x", 1), 64)
    assert _supervised(tokenizer, tok) == ["a", "b", "<|end|>"]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}]},
            "messages[1].role",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 3}]},
            "messages[1].content",
        ),
        ({"messages": [{"role": "user", "content": "q"}]}, "messages"),
        ({"prompt": "q"}, "completion"),
        ({"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}, "completion"),
        ({"input": "q"}, "<row>"),
    ],
)
def test_malformed_rows_name_file_line_and_field(tmp_path, row, field):
    path = tmp_path / "d.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as err:
        load_jsonl(path)
    assert (err.value.source, err.value.line, err.value.field) == (str(path), 2, field)
    assert f"{path}:2: field {field!r}" in str(err.value)


def test_invalid_json_and_skip_bad_rows_counts(tmp_path):
    path = tmp_path / "d.jsonl"
    good = json.dumps({"prompt": "a", "completion": "b"})
    path.write_text(f"{good}\n{{not json\n\n{good}\n{json.dumps({'text': 5})}\n")
    with pytest.raises(DataError, match=r"d.jsonl:2: field '<json>': invalid JSON"):
        load_jsonl(path)
    rows, report = load_jsonl(path, skip_bad_rows=True)
    assert [r.line for r in rows] == [1, 4]
    assert (report.rows, report.skipped) == (4, 2)
    assert "d.jsonl:5: field 'text'" in report.errors[1]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_truncation_is_counted_and_empty_examples_dropped(tokenizer):
    long = parse_row(
        {"messages": [{"role": "user", "content": "x" * 20}, {"role": "assistant", "content": "y" * 20}]},
        "x",
        1,
    )
    short = parse_row(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "x", 2
    )
    seqs, stats = build_sequences(tokenizer, [long, short], max_len=30)
    assert (stats.truncated, stats.dropped, stats.sequences) == (1, 0, 2)
    assert len(seqs[0].input_ids) == 30
    seqs, stats = build_sequences(tokenizer, [long, short], max_len=15)  # prompt alone fills 15 tokens
    assert (stats.truncated, stats.dropped, stats.sequences) == (1, 1, 1)


def test_packing_keeps_examples_apart(tokenizer, nano):
    rows = [parse_row({"text": t}, "x", i) for i, t in enumerate(["12+3=15", "7*8=56", "99-1=98"])]
    packed, stats = build_sequences(tokenizer, rows, max_len=64, pack=True)
    single, _ = build_sequences(tokenizer, rows, max_len=64, pack=False)
    assert stats.sequences == 1 and len(single) == 3
    assert packed[0].position_ids == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 7]
    # the first token of each example is never a label (it would be predicted across examples)
    assert [packed[0].labels[i] for i in (0, 8, 15)] == [IGNORE] * 3
    nano.eval()
    with torch.no_grad():
        batch = collate(packed, tokenizer.pad_token_id)
        logits = nano(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
        alone = nano(input_ids=torch.tensor([single[1].input_ids]), use_cache=False).logits
    torch.testing.assert_close(logits[0, 8:15], alone[0], atol=1e-5, rtol=1e-5)


def test_collate_right_pads_with_ignored_labels(tokenizer):
    rows = [parse_row({"text": t}, "x", i) for i, t in enumerate(["abc", "a"])]
    seqs, _ = build_sequences(tokenizer, rows, max_len=16)
    batch = collate(seqs, pad_id=tokenizer.pad_token_id)
    assert batch["input_ids"].tolist()[1] == [97, 258, 256, 256]
    assert batch["labels"].tolist()[1] == [IGNORE, 258, IGNORE, IGNORE]
    assert batch["position_ids"].tolist()[1] == [0, 1, 2, 3]


# ---- exact cases, folded in from test_data_exact.py --------------------------------------------
# Exact cases for the data layer that the mutation run (TESTING.md) found untested: the packing
# boundary and the full text of the template-merge refusal.


def _item(n: int, start: int) -> Sequence:
    ids = list(range(start, start + n))
    return Sequence(ids, list(ids), list(range(n)))


def test_pack_fills_a_row_up_to_exactly_max_len_and_no_further():
    # 3 + 2 = 5 tokens fit a row of 5 exactly; the next 1 starts a new row
    rows = _pack([_item(3, 0), _item(2, 10), _item(1, 20)], max_len=5)
    assert [r.input_ids for r in rows] == [[0, 1, 2, 10, 11], [20]]
    assert [r.position_ids for r in rows] == [[0, 1, 2, 0, 1], [0]]
    # 4 + 2 = 6 > 5: the second example goes to a new row
    rows = _pack([_item(4, 0), _item(2, 10)], max_len=5)
    assert [r.input_ids for r in rows] == [[0, 1, 2, 3], [10, 11]]


def test_template_merge_refusal_gives_the_whole_diagnosis():
    from tests.test_bad_data import _bpe

    tok = _bpe(" ")
    ex = parse_row(
        {"messages": [{"role": "user", "content": "what is 30+3?"}, {"role": "assistant", "content": "33"}]},
        "d.jsonl",
        7,
    )
    with pytest.raises(DataError) as err:
        tokenize_example(tok, ex, 64)
    msg = str(err.value)
    tail = (
        "the chat template is not training-compatible with this tokenizer: the assistant prompt "
        "before message 1 ends in '\\nAssistant: ', whose last ' ' (tokens ['Ġ']) merges with the answer "
        "into ['Ġ33'], so the answer's first token would never be trained; end the template's assistant "
        "header at a token boundary (a newline or a special token, not a trailing space)"
    )
    assert msg.endswith(tail), msg


# ---- exact cases, folded in from test_dataset_exact.py -----------------------------------------
# Exact counts of `build_sequences` and the pad positions of `collate`, by hand with the stub
# tokenizer of test_chat_exact. Written against survivors of the earlier mutation run (TESTING.md).


def test_build_sequences_counts_by_hand():
    user_only = Example("f", 1, messages=[{"role": "user", "content": "q"}])  # nothing supervised
    examples = [
        Example("f", 1, text="xy"),  # 3 tokens, 2 supervised (the first is never a label)
        user_only,
        user_only,
        Example("f", 2, prompt="abcdefgh", completion="e"),  # cut at 8: only the prompt is left -> dropped
        Example("f", 3, text="abcdefghij"),  # cut at 8: 8 tokens, 7 supervised
    ]
    sequences, stats = build_sequences(Stub(), examples, max_len=8)  # ("user:q|" is 7 tokens)
    assert stats == DatasetStats(
        examples=5, truncated=2, dropped=1, empty=2, sequences=2, tokens=3 + 8, supervised_tokens=2 + 7
    )
    assert sequences[0] == Sequence(codes("xy") + [EOS], [IGNORE, ord("y"), EOS], [0, 1, 2])


def test_collate_continues_positions_after_each_row():
    batch = [
        Sequence([1, 2, 3, 4, 5], [IGNORE, 2, 3, 4, 5], [0, 1, 2, 0, 1]),
        Sequence([7, 8, 9], [IGNORE, 8, 9], [0, 1, 2]),
        Sequence([], [], []),
    ]
    out = collate(batch, pad_id=0)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0], [0, 0, 0, 0, 0]]
    assert out["labels"].tolist() == [[IGNORE, 2, 3, 4, 5], [IGNORE, 8, 9, IGNORE, IGNORE], [IGNORE] * 5]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
