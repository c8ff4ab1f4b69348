"""Policy-gradient loss, KL estimators and entropy: pure functions over per-token tensors.

Shapes: B sequences x T completion positions. `mask_B_T` is True (or 1) at valid completion tokens;
values at masked positions never reach a loss, a gradient or a statistic.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token", "sample", "constant"]


def masked_mean(
    x_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar over valid tokens.

        token:    sum_{b,t} m x / sum_{b,t} m                 (DAPO token-level loss, Yu et al. 2025 §3.3)
        sample:   1/B sum_b (sum_t m x / sum_t m)             (GRPO, Shao et al. 2024 eq. 3)
        constant: sum_{b,t} m x / (B * max_tokens)            (Dr. GRPO, Liu et al. 2025: no length normalization)

    "sample" counts a sequence without valid tokens as 0 in the mean over B.
    """
    mask_B_T = mask_B_T.bool()
    total_B = torch.where(mask_B_T, x_B_T, 0.0).sum(dim=-1)
    if aggregation == "token":
        return total_B.sum() / mask_B_T.sum().clamp_min(1)
    if aggregation == "sample":
        return (total_B / mask_B_T.sum(dim=-1).clamp_min(1)).mean()
    if aggregation == "constant":
        if max_tokens is None:
            raise ValueError('aggregation="constant" needs max_tokens (the generation budget)')
        return total_B.sum() / (mask_B_T.shape[0] * max_tokens)
    raise ValueError(f"unknown aggregation {aggregation!r}; expected 'token', 'sample' or 'constant'")


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi(x) - log ref(x), x ~ pi: unbiased for KL(pi || ref), high variance, can be negative.

    Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). Elementwise.
    """
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log pi(x) - log ref(x))^2, x ~ pi: biased, low variance, >= 0 (Schulman, as above)."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log ref - log pi) - (log ref - log pi) - 1, x ~ pi: unbiased, low variance, >= 0.

    Schulman (as above); the GRPO KL penalty, DeepSeekMath eq. 4. Written with expm1 so that rounding
    near log ref = log pi cannot make it negative.
    """
    log_ratio = ref_logp - logp
    return torch.expm1(log_ratio) - log_ratio


def policy_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017 eq. 7) with decoupled bounds (DAPO clip-higher,
    Yu et al. 2025 eq. 10):

        rho = exp(log pi - log pi_old)
        l   = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A),   reduced by `masked_mean`

    advantages_B_T may be (B, 1) to broadcast a sample's advantage. Stats (detached, 0-dim):
    clip_frac (share of valid tokens whose gradient is zeroed by clipping: A > 0 and rho > 1 + clip_high,
    or A < 0 and rho < 1 - clip_low), approx_kl (token mean of k3 for KL(pi_old || pi)), ratio_mean.
    """
    mask_B_T = mask_B_T.bool()
    # Zero the log-ratio under the mask before exp: padding can then never overflow into inf/NaN gradients.
    log_ratio = torch.where(mask_B_T, logprobs_B_T - old_logprobs_B_T, 0.0)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * advantages_B_T, clipped_ratio * advantages_B_T)
    loss = masked_mean(per_token, mask_B_T, aggregation, max_tokens)
    with torch.no_grad():
        clipped = ((advantages_B_T > 0) & (ratio > 1.0 + clip_high)) | (
            (advantages_B_T < 0) & (ratio < 1.0 - clip_low)
        )
        stats = {
            "clip_frac": masked_mean(clipped.to(ratio.dtype), mask_B_T),
            "approx_kl": masked_mean(kl_k3(old_logprobs_B_T, logprobs_B_T), mask_B_T),
            "ratio_mean": masked_mean(ratio, mask_B_T),
        }
    return loss, stats


def entropy_from_logits(logits_B_T_V: torch.Tensor) -> torch.Tensor:
    """H_t = -sum_v p_v log p_v per position, in float32 from log_softmax. (B, T, V) -> (B, T).

    Logits of -inf (a masked vocabulary) contribute 0, not 0 * -inf = NaN.
    """
    logp = F.log_softmax(logits_B_T_V.float(), dim=-1)
    return -(logp.exp() * logp.clamp_min(torch.finfo(logp.dtype).min)).sum(dim=-1)


def kl_penalized_rewards(
    outcome_B: torch.Tensor, kl_B_T: torch.Tensor, mask_B_T: torch.Tensor, beta: float
) -> torch.Tensor:
    """Token rewards for RLHF-style PPO (Ouyang et al. 2022 eq. 2; Stiennon et al. 2020 §3.4):

        r_t = -beta * kl_t  at every valid token,  plus the outcome reward on the last valid token.

    kl_B_T is usually k1 from rollout-time logprobs (a constant, not differentiated). -> (B, T)
    """
    mask_B_T = mask_B_T.bool()
    counts_B_T = mask_B_T.long().cumsum(dim=-1)
    last_B_T = mask_B_T & (counts_B_T == counts_B_T[:, -1:])
    rewards = torch.where(mask_B_T, -beta * kl_B_T, 0.0)
    return rewards + torch.where(last_B_T, outcome_B[:, None].to(rewards.dtype), 0.0)
