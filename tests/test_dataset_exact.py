"""Exact counts of `build_sequences` and the pad positions of `collate`, by hand with the stub
tokenizer of test_chat_exact. Written against survivors of the earlier mutation run (TESTING.md)."""

from tests.test_chat_exact import EOS, Stub, codes

from temper.data.chat import IGNORE
from temper.data.dataset import DatasetStats, Sequence, build_sequences, collate
from temper.data.formats import Example


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
