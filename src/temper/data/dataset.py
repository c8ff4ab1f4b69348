"""Turn validated rows into training sequences: tokenize, count truncation, optionally pack."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from temper.data.chat import IGNORE, tokenize_example
from temper.data.formats import Example, NoUsableRowsError

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass
class Sequence:
    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]  # restart at 0 for every packed example


@dataclass
class DatasetStats:
    examples: int = 0
    truncated: int = 0  # examples cut at max_len (kept if anything supervised remains)
    dropped: int = 0  # examples with no supervised token left after truncation
    empty: int = 0  # examples with no supervised token at all (not counted in `dropped`)
    sequences: int = 0
    tokens: int = 0
    supervised_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def build_sequences(
    tokenizer: PreTrainedTokenizerBase, examples: list[Example], max_len: int, pack: bool = False
) -> tuple[list[Sequence], DatasetStats]:
    """Tokenize every example; with `pack`, concatenate whole examples into rows of <= max_len.

    Packed examples get their own position ids, so the model's packed-sequence masking keeps
    them from attending to each other, and the first token of each is never a label (it would be
    predicted from the previous example).
    """
    stats = DatasetStats(examples=len(examples))
    items: list[Sequence] = []
    for ex in examples:
        tok = tokenize_example(tokenizer, ex, max_len)
        stats.truncated += tok.truncated
        if all(label == IGNORE for label in tok.labels[1:]):
            if tok.truncated:
                stats.dropped += 1
            else:
                stats.empty += 1
            continue
        labels = [IGNORE] + tok.labels[1:]
        items.append(Sequence(tok.input_ids, labels, list(range(len(tok.input_ids)))))
    sequences = _pack(items, max_len) if pack else items
    stats.sequences = len(sequences)
    stats.tokens = sum(len(s.input_ids) for s in sequences)
    stats.supervised_tokens = sum(sum(label != IGNORE for label in s.labels) for s in sequences)
    return sequences, stats


def require_sequences(
    sequences: list[Sequence], stats: DatasetStats, sources: list[str], malformed: int, max_len: int
) -> None:
    """Refuse a data set left with nothing to train on, saying where every row went, before
    training starts (an empty set would fail deep in the loop with a traceback naming neither)."""
    if sequences:
        return
    read = stats.examples + malformed
    raise NoUsableRowsError(
        sources,
        f"{read} rows read: {malformed} malformed (skipped), {stats.empty} with nothing to train on, "
        f"{stats.dropped} longer than max_len={max_len} (nothing supervised left after truncation)",
    )


def _pack(items: list[Sequence], max_len: int) -> list[Sequence]:
    rows: list[Sequence] = []
    current = Sequence([], [], [])
    for item in items:
        if current.input_ids and len(current.input_ids) + len(item.input_ids) > max_len:
            rows.append(current)
            current = Sequence([], [], [])
        current.input_ids += item.input_ids
        current.labels += item.labels
        current.position_ids += item.position_ids
    if current.input_ids:
        rows.append(current)
    return rows


def collate(batch: list[Sequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row. No attention mask: with right padding a causal model never
    attends to the pads from a real token, and leaving it out lets packed rows be detected from
    `position_ids`. Pad positions continue the last sequence's numbering; their labels are ignored."""
    import torch

    width = max(len(s.input_ids) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(batch), width), dtype=torch.long)
    for row, s in enumerate(batch):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids)
        labels[row, :n] = torch.tensor(s.labels)
        last = s.position_ids[-1] + 1 if n else 0
        positions[row, :n] = torch.tensor(s.position_ids)
        positions[row, n:] = torch.arange(last, last + width - n)
    return {"input_ids": ids, "labels": labels, "position_ids": positions}
