"""Outcome advantage estimators: one scalar reward per sample -> one advantage per sample.

Convention: `rewards_G_N` holds G prompts x N samples per prompt (a group is a row). The result has the
same shape; `advantages_G_N.reshape(-1)` is in prompt-major order (all samples of prompt 0, then prompt 1,
...), and the trainer broadcasts each sample's advantage over its completion tokens.

A group whose rewards are all equal carries no learning signal; every estimator here gives it exactly 0
(never NaN, never rounding noise such as 1e-8 / eps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def _centered(rewards_G_N: torch.Tensor, min_samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """r - mean_group(r), set to exactly 0 in constant groups; also returns which groups are constant (G, 1)."""
    import torch

    if rewards_G_N.dim() != 2 or rewards_G_N.shape[1] < min_samples:
        raise ValueError(f"rewards must be (G, N) with N >= {min_samples}, got {tuple(rewards_G_N.shape)}")
    rewards_G_N = rewards_G_N if rewards_G_N.is_floating_point() else rewards_G_N.float()
    constant_G_1 = (rewards_G_N == rewards_G_N[:, :1]).all(dim=1, keepdim=True)
    centered = rewards_G_N - rewards_G_N.mean(dim=1, keepdim=True)
    return torch.where(constant_G_1, 0.0, centered), constant_G_1


def grpo(rewards_G_N: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalized advantage (Shao et al. 2024, DeepSeekMath, §4.1.2 outcome supervision):

        A_i = (r_i - mean_j r_j) / (std_j r_j + eps)        over the N samples of one prompt

    std is the unbiased sample std (divides by N - 1), as `torch.std` in TRL and verl; hence N >= 2.
    """
    import torch

    centered, constant_G_1 = _centered(rewards_G_N, min_samples=2)
    std_G_1 = centered.std(dim=1, keepdim=True)
    return torch.where(constant_G_1, 0.0, centered / (std_G_1 + eps))


def dr_grpo(rewards_G_N: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): no std division,

        A_i = r_i - mean_j r_j

    because dividing by the group std up-weights prompts that are nearly always (or never) solved.
    """
    return _centered(rewards_G_N, min_samples=2)[0]


def rloo(rewards_G_N: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", the RLOO estimator):

        A_i = r_i - 1/(N-1) sum_{j != i} r_j  =  N/(N-1) * (r_i - mean_j r_j)

    The second form is used: it is exactly 0 in constant groups. Needs N >= 2.
    """
    centered = _centered(rewards_G_N, min_samples=2)[0]
    n = centered.shape[1]
    return centered * (n / (n - 1))


def reinforce_pp(
    rewards_G_N: torch.Tensor,
    group_baseline: bool = True,
    eps: float = 1e-8,
    total: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262) with global batch normalization (eq. 10):

        A_i = r_i - mean_group(r)                      "REINFORCE++-baseline" (group_baseline=True, N >= 2)
        A_i = r_i                                      plain REINFORCE++ (group_baseline=False, e.g. N = 1)
        A_i <- (A_i - mean_batch(A)) / (std_batch(A) + eps)   over all G*N samples

    std_batch is the biased std (divides by G*N), as OpenRLHF's normalization. Constant groups count in
    the batch statistics and keep exactly 0 in the baseline variant. Normalization here is over samples;
    OpenRLHF normalizes over tokens, which weights each sample by its length (and adds token-level KL).
    `total(t)` sums a tensor over data-parallel processes, so that the batch is the global one when
    each process holds some of its groups (default: this process's groups are the batch).
    """
    import torch

    total = total or (lambda t: t)
    if group_baseline:
        adv, constant_G_1 = _centered(rewards_G_N, min_samples=2)
    else:
        adv = rewards_G_N if rewards_G_N.is_floating_point() else rewards_G_N.float()
        constant_G_1 = torch.zeros_like(adv[:, :1], dtype=torch.bool)
    sum_n = total(torch.stack([adv.sum(), torch.tensor(adv.numel(), dtype=adv.dtype, device=adv.device)]))
    mean = sum_n[0] / sum_n[1]
    std = (total((adv - mean).pow(2).sum()) / sum_n[1]).sqrt()
    normalized = (adv - mean) / (std + eps)
    return torch.where(constant_G_1, 0.0, normalized)
