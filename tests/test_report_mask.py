"""The report's mask view: the tokens it marks as supervised are exactly those `data.chat` trains on."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from fakes import EOS, Stub, codes
from temper.data.chat import IGNORE, tokenize_example
from temper.data.formats import Example, parse_row
from temper.data.mask_view import first_per_source, mask_view, mask_views, token_pieces
from temper.report import write_report
from temper.report.training import mask_example

ROWS = [
    {  # two assistant turns: both supervised, the user turn between them not
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "what is 30+3?"},
            {"role": "assistant", "content": "33"},
            {"role": "user", "content": "and 31+3?\tthanks"},
            {"role": "assistant", "content": "34 — sure"},
        ]
    },
    {"prompt": "what is 32+3?", "completion": " 35"},
    {
        "prompt": [{"role": "user", "content": "what is 36+3?"}],
        "completion": [{"role": "assistant", "content": "39"}],
    },
    {"text": "User: what is 37+3?\nAssistant: 40"},
]

# a ChatML-style template on a BPE tokenizer trained here (no download), Qwen's layout: the turn
# ends in <|im_end|> and a newline, and the eos token is a different special token
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chatml_bpe() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(
        [f"user\nwhat is {n}+3?\nassistant\n{n + 3}\n" for n in range(30, 40)] * 20, trainer
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    return tok


def _spans(page: str) -> list[tuple[int, bool]]:
    """(token id, marked supervised) of each token span in the rendered HTML, in order."""
    found = re.findall(r'<span (?:class="([^"]*)" )?title="id (\d+)', page)
    return [(int(i), "sup" in cls.split()) for cls, i in found]


@pytest.mark.parametrize("which", ["builtin", "chatml_bpe"])
def test_rendered_mask_marks_exactly_the_supervised_tokens(which, tokenizer):
    tok = tokenizer if which == "builtin" else _chatml_bpe()
    for n, row in enumerate(ROWS):
        ex = parse_row(row, "d.jsonl", n + 1)
        labels = tokenize_example(tok, ex, 256).labels
        view = mask_view(tok, ex, 256)
        expected = [label != IGNORE for label in labels]
        assert view["mask"] == expected and (0 < sum(expected) < len(expected)) == ("text" not in row)
        assert "".join(view["pieces"]) == tok.decode(view["ids"], skip_special_tokens=False)
        assert _spans(mask_example(view)) == list(zip(view["ids"], expected, strict=True))


def test_pieces_show_whitespace_special_tokens_and_split_characters(tokenizer):
    ex = parse_row({"messages": ROWS[0]["messages"]}, "d.jsonl", 1)
    view = mask_view(tokenizer, ex, 256)
    pieces = view["pieces"]
    assert pieces[:3] == ["<|system|>", "B", "e"] and view["special"][:3] == [1, 0, 0]
    # "—" is three bytes, three byte tokens: the first two carry nothing, the third the character
    i = pieces.index("—")
    assert pieces[i - 2 : i] == ["", ""] and view["mask"][i - 2 : i + 1] == [1, 1, 1]
    html = mask_example(view)
    assert '<span class="sup sp" title="id 258 (special): supervised">&lt;|end|&gt;</span>' in html
    assert '<span class="ws">→</span>' in html and '<span class="ws">·</span>' in html
    assert "<span class='ws'>" not in html and "<script" not in html


def test_sentencepiece_style_leading_space_is_kept():
    """A Metaspace tokenizer drops a word's leading space when the token is decoded alone."""
    sp = Tokenizer(models.BPE())
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Metaspace()
    sp.train_from_iterator(
        ["the cat sat on the mat"] * 10, trainers.BpeTrainer(vocab_size=60, show_progress=False)
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=sp)
    ids = tok("the cat sat", add_special_tokens=False)["input_ids"]
    assert "".join(token_pieces(tok, ids)) == tok.decode(ids) == "the cat sat"
    assert " cat" in token_pieces(tok, ids)


def test_eos_never_supervised_is_named():
    """ChatML's turn ends in <|im_end|>; a tokenizer whose eos is <|endoftext|> never learns to stop."""
    tok = _chatml_bpe()
    view = mask_view(tok, parse_row({"messages": ROWS[0]["messages"][1:3]}, "d.jsonl", 1), 256)
    assert "eos_token &#x27;&lt;|endoftext|&gt;&#x27; is not among the supervised tokens" in mask_example(
        view
    )
    tok.eos_token = "<|im_end|>"
    view = mask_view(tok, parse_row({"messages": ROWS[0]["messages"][1:3]}, "d.jsonl", 1), 256)
    assert "is not among the supervised tokens" not in mask_example(view)


def test_one_example_per_source_first_by_line_and_shown_in_the_report(tmp_path: Path, tokenizer):
    rows = [parse_row(ROWS[1], "b.jsonl", n) for n in (5, 2, 9)] + [parse_row(ROWS[3], "a.jsonl", 4)]
    assert [(e.source, e.line) for e in first_per_source(rows)] == [("b.jsonl", 2), ("a.jsonl", 4)]
    sft = tmp_path / "run" / "02-sft"
    sft.mkdir(parents=True)
    (sft / "stage.json").write_text(json.dumps({"kind": "sft", "seconds": 1.0}))
    (sft / "examples.json").write_text(json.dumps(mask_views(tokenizer, rows, 256)))
    page = write_report(tmp_path / "run").read_text()
    assert "Training examples as the loss sees them" in page and 'class="sup"' in page
    assert "b.jsonl, row 2: " in page and "a.jsonl, row 4: " in page and "row 5" not in page


# ---- exact cases, folded in from test_mask_view_exact.py ---------------------------------------
# Exact tests of `temper.data.mask_view` with stub tokenizers whose decoding is known by hand:
# byte tokens that split a UTF-8 character, the decode options that keep special tokens and spaces,
# the special-token set and the whole view. Written against the mutants of this run (TESTING.md).


class Bytes:
    """One token per byte; decoding replaces invalid UTF-8 with U+FFFD, as byte-level BPE does."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_a_split_character_is_carried_by_the_token_that_completes_it():
    euro = list("€".encode())  # e2 82 ac
    assert token_pieces(Bytes(), [0x61, *euro, 0x62]) == ["a", "", "", "€", "b"]


def test_an_unfinished_character_at_the_end_is_shown_as_it_is():
    assert token_pieces(Bytes(), [0x61, 0xE2]) == ["a", "\ufffd"]


def test_at_most_four_bytes_wait_for_a_character():
    # five stray continuation bytes: four wait, the fourth shows all four, the fifth its own
    assert token_pieces(Bytes(), [0x80] * 5 + [0x61]) == ["", "", "", "\ufffd" * 4, "", "\ufffda"]


def test_a_piece_whose_context_decodes_otherwise_is_decoded_alone():
    # the window [80 f0 9f 98] shows "\ufffd\ufffd"; with the next byte the context decodes as "\ufffd😀"
    assert token_pieces(Bytes(), [0x80, 0xF0, 0x9F, 0x98, 0x80]) == ["", "", "", "\ufffd\ufffd", "\ufffd"]


class Cleaning(Stub):
    """Drops special tokens (the `tokenizers` library's default) and cleans up spaces (two to one)
    unless told not to; `clean_up_tokenization_spaces=None` means the tokenizer's own setting, as
    in transformers, here True."""

    all_special_ids = [EOS]
    added_tokens_decoder = {
        EOS: SimpleNamespace(special=True),
        7: SimpleNamespace(special=False),
        8: object(),
    }
    eos_token = "<eos>"

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=None):
        clean_up_tokenization_spaces = (
            True if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        )
        text = "".join("<eos>" if i == EOS else chr(i) for i in ids if not (skip_special_tokens and i == EOS))
        return text.replace("  ", " ") if clean_up_tokenization_spaces else text


def test_pieces_keep_special_tokens_and_spaces():
    assert token_pieces(Cleaning(), [*codes("a  ."), EOS]) == ["a", " ", " ", ".", "<eos>"]


def test_the_whole_view():
    view = mask_view(Cleaning(), Example("f.jsonl", 3, prompt="q", completion="a"), max_len=2)
    assert view == {
        "source": "f.jsonl",
        "line": 3,
        "truncated": True,
        "ids": codes("qa"),
        "pieces": ["q", "a"],
        "special": [0, 0],
        "mask": [0, 1],
        "eos_token": "<eos>",
    }
    view = mask_view(Cleaning(), Example("f.jsonl", 3, prompt="\x07\x08", completion="a"), max_len=9)
    assert view["special"] == [0, 0, 0, 1]  # only tokens marked special: not 7, not 8 (no flag)


def test_first_per_source_keeps_the_first_of_equal_lines():
    a1, a2 = Example("a", 3, text="x"), Example("a", 3, text="y")
    b = Example("b", 9, text="z")
    assert first_per_source([Example("a", 5, text="w"), b, a1, a2]) == [a1, b]
