"""Exact tests of `temper.data.mask_view` with stub tokenizers whose decoding is known by hand:
byte tokens that split a UTF-8 character, the decode options that keep special tokens and spaces,
the special-token set and the whole view. Written against the mutants of this run (TESTING.md)."""

from types import SimpleNamespace

from tests.test_chat_exact import EOS, Stub, codes

from temper.data.formats import Example
from temper.data.mask_view import first_per_source, mask_view, token_pieces


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
