"""The loss mask made visible: one training example per data source, token by token, with the
tokens the loss trains on marked. The SFT stage writes these to `examples.json` and the report
draws them (`temper.report.training`), so a template that supervises the prompt, or never the end
of turn, is seen before it is trained on.

The mask is `tokenize_example`'s labels (not a second reconstruction of them): a token is marked
exactly when its label is not IGNORE, so what the page shows is what the loss sees.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from temper.data.chat import IGNORE, tokenize_example
from temper.data.formats import Example

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedTokenizerBase

MAX_BYTES_PER_CHAR = 4  # a UTF-8 character spans at most 4 byte tokens


def first_per_source(examples: Iterable[Example]) -> list[Example]:
    """The first row (lowest line) of each source, sources in order of first appearance; the
    training list is shuffled, so "first" is by line, not by position."""
    first: dict[str, Example] = {}
    for e in examples:
        if e.source not in first or e.line < first[e.source].line:
            first[e.source] = e
    return list(first.values())


def token_pieces(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """The text each token adds, so that "".join(pieces) is the decoded sequence.

    Each token is decoded after the previous piece (its left context), because SentencePiece
    decoders drop a word's leading space when a token is decoded alone. A token holding only part
    of a UTF-8 character (byte-level BPE) decodes to U+FFFD: it gets "" and the token that
    completes the character carries it."""

    def decode(xs: list[int]) -> str:
        return tokenizer.decode(xs, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    out: list[str] = []
    context: list[int] = []
    pending = 0  # first id not yet in a piece
    for i in range(len(ids)):
        window = ids[pending : i + 1]
        head, full = decode(context), decode(context + window)
        if full.endswith("\ufffd") and len(window) < MAX_BYTES_PER_CHAR and i + 1 < len(ids):
            out.append("")
            continue
        out.append(full[len(head) :] if full.startswith(head) else decode(window))
        context, pending = window, i + 1
    return out


def mask_view(tokenizer: PreTrainedTokenizerBase, example: Example, max_len: int) -> dict[str, Any]:
    """One example as the trainer sees it: ids, the text of each token, which are special tokens,
    and the loss mask (1 where the label is the token, 0 where it is IGNORE)."""
    tok = tokenize_example(tokenizer, example, max_len)
    special = set(tokenizer.all_special_ids) | {
        i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)
    }
    return {
        "source": example.source,
        "line": example.line,
        "truncated": tok.truncated,
        "ids": tok.input_ids,
        "pieces": token_pieces(tokenizer, tok.input_ids),
        "special": [int(i in special) for i in tok.input_ids],
        "mask": [int(label != IGNORE) for label in tok.labels],
        "eos_token": tokenizer.eos_token,
    }


def mask_views(
    tokenizer: PreTrainedTokenizerBase, examples: Iterable[Example], max_len: int
) -> dict[str, Any]:
    """`examples.json`: the first example of each source as `mask_view` shows it."""
    return {"examples": [mask_view(tokenizer, e, max_len) for e in first_per_source(examples)]}
