"""The process reward model's loss: binary cross-entropy on each labelled step.

A PRM (Lightman et al. 2023, "Let's Verify Step by Step", arXiv:2305.20050, section 2.6) is a
language model with a scalar head read at the last token of every step: the logit z of "this step
is correct". Its labels sit at those tokens (1 good, 0 bad) and IGNORE everywhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temper.labels import IGNORE

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def step_bce_loss(
    logits_B_T: torch.Tensor, labels_B_T: torch.Tensor, num_steps: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Per-step binary cross-entropy with logits, summed over labelled steps and divided by N:

        L = (1 / N) * sum_{b,t : y_{b,t} != -100} [ log(1 + exp(z_{b,t})) - y_{b,t} z_{b,t} ]
          = (1 / N) * sum -[ y log sigma(z) + (1 - y) log(1 - sigma(z)) ]

    so dL/dz = (sigma(z) - y) / N: a good step's logit is pushed up, a bad one's down.
    logits (B, T) (the head's one output per token, squeezed) and labels (B, T) in {0, 1, -100}
    are aligned: no shift, the score at token t reads tokens <= t, the whole step. N is
    `num_steps` when given (the labelled steps of the whole optimizer step, so that micro-batching
    and data-parallel splits sum to the gradient of one big batch), otherwise this batch's count.
    """
    import torch
    import torch.nn.functional as F

    mask_B_T = labels_B_T != IGNORE
    z = logits_B_T[mask_B_T]
    z = z.to(torch.promote_types(z.dtype, torch.float32))  # at least fp32 (bf16 logits)
    y = labels_B_T[mask_B_T].to(z.dtype)
    total = F.binary_cross_entropy_with_logits(z, y, reduction="sum")
    n = mask_B_T.sum() if num_steps is None else num_steps
    return total / torch.as_tensor(n, dtype=total.dtype, device=total.device).clamp_min(1)
