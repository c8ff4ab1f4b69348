"""On-policy distillation: the teacher grades every token the student sampled.

The student samples y ~ pi_student; the teacher scores each sampled token, and the per-token
advantage is the negative reverse KL estimate, log pi_teacher(y_t) - log pi_student(y_t) (Agarwal
et al. 2024, "On-Policy Distillation of Language Models" (GKD), with the reverse KL; Thinking
Machines 2025, "On-Policy Distillation"). Policy gradient with this advantage descends the reverse
KL(pi_student || pi_teacher) on the student's own samples: mode-seeking, and every token carries
signal where an outcome reward gives one number per episode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def reverse_kl_advantages(
    k1_R_T: torch.Tensor,
    mask_R_T: torch.Tensor,
    coef: float = 1.0,
    total: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """A_t = coef * (mean_k1 - k1_t) at the sampled (masked) tokens, 0 elsewhere, where

        k1_t = log pi_student(y_t) - log pi_teacher(y_t)     (per-token reverse KL estimate)
        mean_k1 = sum over the batch's masked tokens of k1 / their count

    The mean is a baseline: it centres the advantages without changing the expected gradient (a
    constant times the score function has mean 0), as tinker-cookbook's `incorporate_kl_penalty`
    (`kl_coef * mask * (avg_logp_diff - logp_diff)`, discount 0: no credit to earlier tokens).
    `total` sums a tensor over data-parallel processes so the mean is the global batch's.
    """
    m = mask_R_T.to(k1_R_T.dtype)
    stats = torch.stack([(k1_R_T * m).sum(), m.sum()])
    if total is not None:
        stats = total(stats)
    mean = stats[0] / stats[1].clamp(min=1.0)
    return coef * (mean - k1_R_T) * m
