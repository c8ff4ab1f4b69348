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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
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
    import torch

    m = mask_R_T.to(k1_R_T.dtype)
    stats = torch.stack([(k1_R_T * m).sum(), m.sum()])
    if total is not None:
        stats = total(stats)
    mean = stats[0] / stats[1].clamp(min=1.0)
    return coef * (mean - k1_R_T) * m


def forward_kl_loss(
    student_logits_B_T_V: torch.Tensor,
    teacher_logits_B_T_V: torch.Tensor,
    mask_B_T: torch.Tensor,
    temperature: float = 1.0,
    num_tokens: int | None = None,
) -> torch.Tensor:
    """Token-level forward KL from the teacher to the student, averaged over the masked tokens:

        L = sum_{b,t} m_bt KL(p_T(.|b,t) || p_S(.|b,t)) / N,   N = sum_{b,t} m_bt
        KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v)),   p = softmax(logits / temperature)

    the full next-token distributions at each position of a sequence the teacher sampled (word-level
    knowledge distillation, Hinton et al. 2015 and Kim & Rush 2016 eq. 3; GKD's supervised KD,
    Agarwal et al. 2024 eq. 1 with beta = 0, which is TRL's `generalized_jsd_loss(beta=0)`). Mass
    covering: the student is pushed to put probability wherever the teacher does. Prompt
    distillation's loss (Snell et al. 2022, "Learning by Distilling Context"): the teacher's
    logits come from a prompt with the instruction, the student's from the same tokens without it.
    The teacher's logits are constants (detached); an all-zero mask gives 0. N is `num_tokens` when
    given (the masked tokens of the whole optimizer step, so that micro-batches add up to the
    step's loss, as `losses.sft_loss` does), otherwise the count in this batch.
    """
    import torch

    dtype = torch.promote_types(student_logits_B_T_V.dtype, torch.float32)  # at least fp32 (bf16 logits)
    log_p_student = torch.log_softmax(student_logits_B_T_V.to(dtype) / temperature, dim=-1)
    log_p_teacher = torch.log_softmax(teacher_logits_B_T_V.detach().to(dtype) / temperature, dim=-1)
    kl_B_T = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)
    m = mask_B_T.to(kl_B_T.dtype)
    n = m.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=kl_B_T.dtype)
    return (kl_B_T * m).sum() / n.clamp(min=1.0)
