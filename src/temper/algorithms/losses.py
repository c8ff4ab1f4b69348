"""Losses: short pure functions over tensors, each with its formula."""

from __future__ import annotations

from typing import TYPE_CHECKING

from temper.labels import IGNORE

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def sft_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_tokens: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token cross-entropy over supervised tokens.

        L = -(1 / N) * sum_{b,t : y_{b,t+1} != -100} log p(y_{b,t+1} | x_{b,<=t})

    logits (B, T, V) and labels (B, T) are aligned with the inputs (the shift happens here).
    N is `num_tokens` when given (the supervised-token count of the whole optimizer step, so that
    gradient accumulation and data-parallel splits give the same gradient as one big batch),
    otherwise the count in this batch.
    """
    import torch
    import torch.nn.functional as F

    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE)  # (B, T): position t predicts label t+1
    # flattened (B*T, V) logits: no shifted copy of the largest tensor in the step; at least fp32
    # (bf16 logits), fp64 for a fp64 model
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    n = (targets != IGNORE).sum() if num_tokens is None else num_tokens
    return total / torch.as_tensor(n, dtype=total.dtype).clamp_min(1)
