"""Exact tests of `temper.data.chat` with a stub tokenizer whose every output is known by hand: raw
prompt/completion/text rows get no special tokens but the end token, the truncation flag at
exactly `max_len`, and the refusal of a template that rewrites history. Written against the
mutants mutmut left alive (TESTING.md)."""

import pytest

from fakes import EOS, Stub, codes
from temper.data.chat import IGNORE, TemplateError, tokenize_example, tokenize_messages
from temper.data.formats import DataError, Example


def test_raw_rows_get_no_special_tokens_but_the_end_token():
    tok = Stub()
    t = tokenize_example(tok, Example("f", 1, prompt="ab", completion="c"), max_len=10)
    assert (t.input_ids, t.labels, t.truncated) == (
        codes("abc") + [EOS],
        [IGNORE, IGNORE] + codes("c") + [EOS],
        False,
    )
    t = tokenize_example(tok, Example("f", 1, text="xy"), max_len=10)
    assert (t.input_ids, t.labels) == (codes("xy") + [EOS], codes("xy") + [EOS])


def test_truncation_is_flagged_only_past_max_len():
    tok = Stub()
    t = tokenize_example(tok, Example("f", 1, text="xy"), max_len=3)  # 3 tokens with the end token
    assert (t.input_ids, t.truncated) == (codes("xy") + [EOS], False)
    t = tokenize_example(tok, Example("f", 1, text="xyz"), max_len=3)
    assert (t.input_ids, t.labels, t.truncated) == (codes("xyz"), codes("xyz"), True)


def test_assistant_turns_are_labelled_by_hand():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "r"},
        {"role": "assistant", "content": "b"},
    ]
    ids, labels = tokenize_messages(Stub(), messages)
    assert ids == codes("user:q|assistant:a|user:r|assistant:b|")
    supervised = "".join(chr(x) if x != IGNORE else "." for x in labels)
    assert supervised == "." * len("user:q|assistant:") + "a|" + "." * len("user:r|assistant:") + "b|"


def test_a_template_that_rewrites_history_is_refused_in_words():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "r"},
        {"role": "assistant", "content": "b"},
    ]
    with pytest.raises(TemplateError) as err:
        tokenize_messages(Stub(rewrite=True), messages)
    assert str(err.value) == (
        "the chat template does not render conversations as prefixes of each other, so assistant "
        "tokens cannot be located; use a template without history rewriting"
    )
    with pytest.raises(DataError) as err:
        tokenize_example(Stub(rewrite=True), Example("f.jsonl", 4, messages=messages), max_len=100)
    assert str(err.value).startswith("f.jsonl:4: field '<chat_template>': the chat template does not render")
