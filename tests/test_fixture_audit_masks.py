"""SFT loss masks on fixtures where the plausible one-line bugs differ, each checked as the exact
text of the trained tokens: a multi-turn chat whose tool output occurs several times in two
assistant turns (every occurrence masked, not the first), a chat prompt with a chat completion
(its earlier assistant turn and the assistant header never trained, the end-of-turn token
always), a plain prompt and
completion (the eos trained), and packed examples of different lengths (the first token of each
never a label, position ids restarting)."""

from __future__ import annotations

from temper.data.chat import IGNORE, tokenize_example
from temper.data.dataset import build_sequences
from temper.data.formats import Example


def _trained(tokenizer, ids, labels) -> str:
    return "".join(tokenizer.decode([t]) for t, lab in zip(ids, labels, strict=True) if lab != IGNORE)


def test_every_occurrence_of_a_tool_output_is_left_out_in_every_turn(tokenizer):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2*3 and 3*2?"},
        {"role": "assistant", "content": "<code>print(2*3)</code>\n6\n<code>print(3*2)</code>\n6\nAnswer: 6"},
        {"role": "user", "content": "and 6*1?"},
        {"role": "assistant", "content": "<code>print(6*1)</code>\n6\nAnswer: 6"},
    ]
    tok = tokenize_example(tokenizer, Example("t", 1, messages=messages, untrained=("\n6\n",)), 512)
    assert _trained(tokenizer, tok.input_ids, tok.labels) == (
        "<code>print(2*3)</code><code>print(3*2)</code>Answer: 6<|end|><code>print(6*1)</code>Answer: 6<|end|>"
    )
    assert tokenizer.decode(tok.input_ids).count("\n6\n") == 3  # the input keeps them


def test_a_chat_prompt_trains_only_its_completion_and_its_end_of_turn(tokenizer):
    """The prompt holds an earlier assistant turn: it is context, never trained on."""
    prompt = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "earlier"},
        {"role": "user", "content": "again"},
    ]
    completion = [{"role": "assistant", "content": "hi"}]
    tok = tokenize_example(tokenizer, Example("t", 1, prompt=prompt, completion=completion), 512)
    assert _trained(tokenizer, tok.input_ids, tok.labels) == "hi<|end|>"
    assert tokenizer.decode(tok.input_ids).endswith("<|assistant|>hi<|end|>")


def test_a_text_prompt_trains_its_completion_and_the_eos(tokenizer):
    tok = tokenize_example(tokenizer, Example("t", 1, prompt="2+2=", completion="4"), 512)
    eos = tokenizer.decode([tokenizer.eos_token_id])
    assert _trained(tokenizer, tok.input_ids, tok.labels) == "4" + eos
    assert tok.labels[-1] == tokenizer.eos_token_id


def test_packed_examples_never_label_their_first_token(tokenizer):
    examples = [Example("t", i, text=text) for i, text in enumerate(["ab", "cdefg", "hij"])]
    alone, _ = build_sequences(tokenizer, examples, max_len=64)
    packed, _ = build_sequences(tokenizer, examples, max_len=64, pack=True)
    assert len(packed) == 1 and [len(s.input_ids) for s in alone] == [3, 6, 4]  # + eos each
    for s in alone:
        assert s.labels[0] == IGNORE and s.labels[1:] == s.input_ids[1:]
    row = packed[0]
    assert row.input_ids == [t for s in alone for t in s.input_ids]
    assert row.labels == [lab for s in alone for lab in s.labels]
    assert row.position_ids == [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3]


def test_packing_fills_a_row_to_exactly_max_len(tokenizer):
    examples = [Example("t", i, text=text) for i, text in enumerate(["ab", "cdefg", "hij"])]
    packed, _ = build_sequences(tokenizer, examples, max_len=9, pack=True)  # 3 + 6 fit exactly
    assert [len(s.input_ids) for s in packed] == [9, 4]
