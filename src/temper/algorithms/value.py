"""Generalized advantage estimation and the PPO value loss, over per-token tensors (B, T)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from temper.algorithms.policy import masked_mean
from temper.lazy import no_grad

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


@no_grad
def gae(
    rewards_B_T: torch.Tensor,
    values_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, eq. 16) over the valid tokens of each sequence:

        delta_t = r_t + gamma V_{t'} - V_t        t' = the next valid token after t; V_{t'} = 0 after the last
        A_t     = delta_t + gamma lam A_{t'}
        R_t     = A_t + V_t                       (the value target)

    Masked positions (right padding; also tokens inside a completion that are not actions, such as tool
    output) are skipped: their rewards are ignored and the next valid token's value and advantage carry
    across them. With gamma = lam = 1, R_t is the reward-to-go. Returns (advantages_B_T, returns_B_T),
    0 at masked positions; computed without gradient (they are targets).
    """
    import torch

    mask_B_T = mask_B_T.bool()
    advantages = torch.zeros_like(values_B_T)
    next_value_B = torch.zeros_like(values_B_T[:, 0])
    next_adv_B = torch.zeros_like(values_B_T[:, 0])
    for t in reversed(range(values_B_T.shape[1])):
        m = mask_B_T[:, t]
        delta = rewards_B_T[:, t] + gamma * next_value_B - values_B_T[:, t]
        adv = delta + gamma * lam * next_adv_B
        advantages[:, t] = torch.where(m, adv, 0.0)
        next_value_B = torch.where(m, values_B_T[:, t], next_value_B)
        next_adv_B = torch.where(m, adv, next_adv_B)
    returns = torch.where(mask_B_T, advantages + values_B_T, 0.0)
    return advantages, returns


def value_loss(
    values_B_T: torch.Tensor,
    old_values_B_T: torch.Tensor,
    returns_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    clip: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped value loss (as in OpenAI baselines' ppo2 and verl's compute_value_loss):

        l_t = 0.5 max((V_t - R_t)^2, (clip(V_t, V_old - c, V_old + c) - R_t)^2)

    clip=None gives the plain 0.5 (V - R)^2. Returns (B, T), 0 at masked positions, to be reduced by
    `masked_mean`. Stats (detached): clip_frac, the share of valid tokens where the clipped branch is
    strictly larger (its gradient is zero).
    """
    import torch

    unclipped = (values_B_T - returns_B_T) ** 2
    if clip is None:
        clipped = unclipped
    else:
        v_clipped = torch.clamp(values_B_T, old_values_B_T - clip, old_values_B_T + clip)
        clipped = (v_clipped - returns_B_T) ** 2
    per_token = torch.where(mask_B_T.bool(), 0.5 * torch.maximum(unclipped, clipped), 0.0)
    with torch.no_grad():
        stats = {"clip_frac": masked_mean((clipped > unclipped).to(unclipped.dtype), mask_B_T)}
    return per_token, stats


@no_grad
def masked_whiten(
    x_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    eps: float = 1e-8,
    total: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Whiten over the valid tokens of the whole batch (verl's verl_F.masked_whiten, as its GAE uses it):

        x <- (x - mean) / sqrt(var + eps),   mean and unbiased var (divides by n - 1) over valid tokens

    Masked positions are 0. With fewer than two valid tokens the variance is undefined (verl raises);
    here the values are only centered. `total(t)` sums a tensor over data-parallel processes, so that
    the statistics are the global batch's (default: this process's rows are the batch).
    """
    import torch

    total = total or (lambda t: t)
    mask_B_T = mask_B_T.bool()
    sum_n = total(torch.stack([torch.where(mask_B_T, x_B_T, 0.0).sum(), mask_B_T.sum().to(x_B_T.dtype)]))
    mean, n = sum_n[0] / sum_n[1].clamp_min(1), sum_n[1]
    centered = torch.where(mask_B_T, x_B_T - mean, 0.0)
    if n < 2:
        return centered
    var = total(centered.pow(2).sum()) / (n - 1)
    return centered * torch.rsqrt(var + eps)
