"""Exact cases for the data layer that the mutation run (TESTING.md) found untested: the packing
boundary and the full text of the template-merge refusal."""

import pytest

from temper.data import DataError, parse_row, tokenize_example
from temper.data.dataset import Sequence, _pack


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
