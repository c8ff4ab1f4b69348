"""Preference data in TRL's formats, validated up front, tokenized with completion-only loss masks.

Formats (https://huggingface.co/docs/trl/dataset_formats#preference):
- paired: {"prompt": ..., "chosen": ..., "rejected": ...}, each a string or a message list
  (prompt messages, then the assistant turns of each completion). The prompt may be implicit:
  {"chosen": [...whole conversation...], "rejected": [...]}, the prompt then being the messages
  (or, for strings, the characters) the two share at the start, as `trl.extract_prompt` splits them;
- unpaired: {"prompt": ..., "completion": ..., "label": true | false} (KTO's desirable / undesirable).

Rows are read by `temper.data.sources` (JSONL, JSON arrays, parquet, arrow, save_to_disk folders,
hub ids), and a bad row raises `DataError` naming file, line and field, as SFT data does: each
side is checked as a prompt-completion row would be (`temper.data.formats.parse_row`), with the
field named `chosen` / `rejected` instead of `completion`. A pair whose chosen and rejected
completions are equal is refused (its DPO loss is constant: it teaches nothing), and so is a
file mixing paired and unpaired rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temper.data.chat import IGNORE, tokenize_example
from temper.data.dataset import Sequence
from temper.data.formats import DataError, Example, LoadReport, parse_row, validate_rows
from temper.data.sources import locate, read_rows

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedTokenizerBase

Text = str | list[dict[str, Any]]


@dataclass(frozen=True)
class Pair:
    """A paired preference: `chosen` is preferred to `rejected` as an answer to `prompt`."""

    source: str
    line: int
    prompt: Text
    chosen: Text
    rejected: Text
    tools: list[dict[str, Any]] | None = None
    margin: float | None = None
    """TRL's optional `margin` column: how far apart the reward model must score the two (its
    Bradley-Terry loss; the DPO and KTO stages ignore it)."""


@dataclass(frozen=True)
class Labelled:
    """An unpaired completion labelled desirable (True) or undesirable (False), as KTO reads."""

    source: str
    line: int
    prompt: Text
    completion: Text
    desirable: bool
    tools: list[dict[str, Any]] | None = None


def shared_prefix(chosen: Text, rejected: Text) -> int:
    """How much of chosen and rejected is the implicit prompt: the length of their common prefix
    (messages, or characters), ending before a space the two completions start with, as
    `trl.extract_prompt` splits strings."""
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    if isinstance(chosen, str) and k and chosen[k - 1] == " ":
        k -= 1
    return k


def _side(prompt: Text, completion: Any, field: str, row: dict, source: str, line: int) -> Example:
    """One completion checked as a prompt-completion row, its errors naming `field`."""
    try:
        return parse_row(
            {"prompt": prompt, "completion": completion, "tools": row.get("tools")}, source, line
        )
    except DataError as err:
        raise DataError(
            source, line, err.field.replace("completion", field, 1), err.problem.replace("completion", field)
        ) from None


def parse_preference(row: Any, source: str, line: int) -> Pair | Labelled:
    """Validate one decoded row of a preference data set."""
    if not isinstance(row, dict):
        raise DataError(source, line, "<row>", f"must be a JSON object, got {type(row).__name__}")
    if "chosen" in row or "rejected" in row:
        for key in ("chosen", "rejected"):
            if key not in row:
                raise DataError(
                    source, line, key, "missing (paired preference rows need chosen and rejected)"
                )
        chosen, rejected = row["chosen"], row["rejected"]
        if "prompt" in row:
            prompt = row["prompt"]
        else:
            if isinstance(chosen, str) != isinstance(rejected, str) or not isinstance(chosen, (str, list)):
                raise DataError(
                    source,
                    line,
                    "rejected",
                    "chosen and rejected must both be strings or both be message lists",
                )
            k = shared_prefix(chosen, rejected)
            if k == 0:
                raise DataError(
                    source,
                    line,
                    "prompt",
                    "missing, and chosen and rejected share no leading "
                    + ("text" if isinstance(chosen, str) else "messages")
                    + " to take as the implicit prompt; add a prompt field",
                )
            prompt, chosen, rejected = chosen[:k], chosen[k:], rejected[k:]
        good = _side(prompt, chosen, "chosen", row, source, line)
        _side(prompt, rejected, "rejected", row, source, line)
        if chosen == rejected:
            raise DataError(source, line, "rejected", "is identical to chosen: the pair teaches nothing")
        margin = row.get("margin")
        if margin is not None and (
            isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin)
        ):
            raise DataError(source, line, "margin", f"must be a finite number, got {margin!r}")
        return Pair(
            source, line, prompt, chosen, rejected, good.tools, None if margin is None else float(margin)
        )
    if "label" in row:
        for key in ("prompt", "completion"):
            if key not in row:
                raise DataError(
                    source, line, key, "missing (unpaired rows need prompt, completion and label)"
                )
        if not isinstance(row["label"], bool):
            raise DataError(
                source, line, "label", f"must be true or false (desirable or not), got {row['label']!r}"
            )
        example = _side(row["prompt"], row["completion"], "completion", row, source, line)
        return Labelled(source, line, row["prompt"], row["completion"], row["label"], example.tools)
    raise DataError(
        source,
        line,
        "<row>",
        "has neither 'chosen'/'rejected' (paired preferences) nor 'prompt'/'completion'/'label' "
        f"(unpaired) (keys: {sorted(row)})",
    )


def preference_format(item: Pair | Labelled) -> str:
    """The format of a validated preference row (one file holds one): paired or unpaired, text or messages."""
    chat = not isinstance(item.prompt, str)
    return ("paired" if isinstance(item, Pair) else "unpaired") + (" (messages)" if chat else " (text)")


def load_preferences(
    spec: str | Path, base_dir: Path | None = None, skip_bad_rows: bool = False
) -> tuple[list[Pair | Labelled], LoadReport]:
    """Validated rows of any source `temper.data.sources.read_rows` reads; relative paths resolve
    against `base_dir`. One format per source (paired or unpaired, text or messages)."""
    source = locate(spec, base_dir)
    rows = ((n, row) for _, n, row in read_rows(source, errors="yield"))
    return validate_rows(rows, source.label, skip_bad_rows, parse_preference, preference_format)


def unpair(items: list[Pair | Labelled]) -> list[Labelled]:
    """Unpaired rows for KTO: each pair becomes its chosen (desirable) and its rejected
    (undesirable) completion, as `trl.unpair_preference_dataset` does: every chosen first, then
    every rejected, so that neighbours (whose prompt and completion KTO's KL estimate mismatches,
    `temper.train.preference.kto_items`) answer different prompts. Unpaired rows stay, in front."""
    pairs = [it for it in items if isinstance(it, Pair)]
    out = [it for it in items if isinstance(it, Labelled)]
    out += [Labelled(p.source, p.line, p.prompt, p.chosen, True, p.tools) for p in pairs]
    out += [Labelled(p.source, p.line, p.prompt, p.rejected, False, p.tools) for p in pairs]
    return out


@dataclass
class TokenizedPair:
    chosen: Sequence
    rejected: Sequence
    margin: float = 0.0  # the row's `margin` (0 without one)


@dataclass
class TokenizedLabelled:
    sequence: Sequence
    desirable: bool


@dataclass
class PreferenceStats:
    rows: int = 0
    truncated: int = 0  # completions cut at max_len (kept when a trained token remains)
    dropped: int = 0  # rows left without a trained token in some completion after truncation
    desirable: int = 0  # unpaired rows labelled desirable (KTO)
    undesirable: int = 0


def completion_sequence(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Text,
    completion: Text,
    tools,
    max_len: int,
    where: tuple[str, int],
) -> tuple[Sequence | None, bool]:
    """prompt + completion through the chat template (message lists) or plain (strings, eos
    appended), labels only on the completion's tokens; None when truncation leaves none."""
    tok = tokenize_example(
        tokenizer, Example(*where, prompt=prompt, completion=completion, tools=tools), max_len
    )
    labels = [IGNORE] + tok.labels[1:]
    if all(t == IGNORE for t in labels):
        return None, tok.truncated
    return Sequence(tok.input_ids, labels, list(range(len(tok.input_ids)))), tok.truncated


def tokenize_pairs(
    tokenizer: PreTrainedTokenizerBase, pairs: list[Pair], max_len: int
) -> tuple[list[TokenizedPair], PreferenceStats]:
    stats, out = PreferenceStats(rows=len(pairs)), []
    for p in pairs:
        chosen, cut_c = completion_sequence(
            tokenizer, p.prompt, p.chosen, p.tools, max_len, (p.source, p.line)
        )
        rejected, cut_r = completion_sequence(
            tokenizer, p.prompt, p.rejected, p.tools, max_len, (p.source, p.line)
        )
        stats.truncated += cut_c + cut_r
        if chosen is None or rejected is None:
            stats.dropped += 1
            continue
        out.append(TokenizedPair(chosen, rejected, p.margin or 0.0))
    return out, stats


def tokenize_labelled(
    tokenizer: PreTrainedTokenizerBase, items: list[Labelled], max_len: int
) -> tuple[list[TokenizedLabelled], PreferenceStats]:
    stats, out = PreferenceStats(rows=len(items)), []
    for it in items:
        seq, cut = completion_sequence(
            tokenizer, it.prompt, it.completion, it.tools, max_len, (it.source, it.line)
        )
        stats.truncated += cut
        if seq is None:
            stats.dropped += 1
            continue
        out.append(TokenizedLabelled(seq, it.desirable))
        stats.desirable += it.desirable
        stats.undesirable += not it.desirable
    return out, stats


def mismatched(a: Sequence, b: Sequence) -> Sequence:
    """a's prompt followed by b's completion: the pair KTO's reference point is estimated on."""
    pa = next(i for i, t in enumerate(a.labels) if t != IGNORE)
    pb = next(i for i, t in enumerate(b.labels) if t != IGNORE)
    ids = a.input_ids[:pa] + b.input_ids[pb:]
    return Sequence(ids, a.labels[:pa] + b.labels[pb:], list(range(len(ids))))
