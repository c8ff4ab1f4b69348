"""Policy-gradient loss, KL estimators and entropy: pure functions over per-token tensors.

Shapes: B sequences x T completion positions. `mask_B_T` is True (or 1) at valid completion tokens;
values at masked positions never reach a loss, a gradient or a statistic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


Aggregation = Literal["token", "sample", "constant"]


def masked_sum(
    x_B_T: torch.Tensor, mask_B_T: torch.Tensor, aggregation: Aggregation = "token"
) -> torch.Tensor:
    """The numerator of `masked_mean`: what an aggregation averages, summed over the rows here.

        token, constant:  sum_{b,t} m x
        sample:           sum_b (sum_t m x / sum_t m)

    Summing this over micro-batches (or processes) and dividing once by `aggregation_size` of the
    whole batch gives exactly the whole batch's `masked_mean`: the split never changes a gradient.
    """
    import torch

    mask_B_T = mask_B_T.bool()
    total_B = torch.where(mask_B_T, x_B_T, 0.0).sum(dim=-1)
    if aggregation in ("token", "constant"):
        return total_B.sum()
    if aggregation == "sample":
        return (total_B / mask_B_T.sum(dim=-1).clamp_min(1)).sum()
    raise ValueError(f"unknown aggregation {aggregation!r}; expected 'token', 'sample' or 'constant'")


def aggregation_size(
    mask_B_T: torch.Tensor, aggregation: Aggregation = "token", max_tokens: int | None = None
) -> torch.Tensor:
    """The denominator of `masked_mean`: valid tokens (token), rows (sample), rows x max_tokens (constant)."""
    import torch

    if aggregation == "token":
        return mask_B_T.bool().sum().float()
    if aggregation == "sample":
        return torch.tensor(float(mask_B_T.shape[0]), device=mask_B_T.device)
    if aggregation == "constant":
        if max_tokens is None:
            raise ValueError('aggregation="constant" needs max_tokens (the generation budget)')
        return torch.tensor(float(mask_B_T.shape[0] * max_tokens), device=mask_B_T.device)
    raise ValueError(f"unknown aggregation {aggregation!r}; expected 'token', 'sample' or 'constant'")


def masked_mean(
    x_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar over valid tokens: `masked_sum / aggregation_size`.

        token:    sum_{b,t} m x / sum_{b,t} m                 (DAPO token-level loss, Yu et al. 2025 §3.3)
        sample:   1/B sum_b (sum_t m x / sum_t m)             (GRPO, Shao et al. 2024 eq. 3)
        constant: sum_{b,t} m x / (B * max_tokens)            (Dr. GRPO, Liu et al. 2025: no length normalization)

    "sample" counts a sequence without valid tokens as 0 in the mean over B. A sequence is a batch
    row: an agent episode whose history was rewritten is several rows, each a sample of its own
    carrying the episode's advantage (`train/rollouts.to_batch`; verl's seq-mean-token-mean over
    Agent Lightning's per-call samples does the same), while "token" counts each token once.
    """
    size = aggregation_size(mask_B_T, aggregation, max_tokens)
    return masked_sum(x_B_T, mask_B_T, aggregation) / size.clamp_min(1)


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
    import torch

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
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate (Schulman et al. 2017 eq. 7) with decoupled bounds (DAPO
    clip-higher, Yu et al. 2025 eq. 10) and optional dual clip (Ye et al. 2020, arXiv:1912.09729 §3.1):

        rho = exp(log pi - log pi_old)
        l   = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)
        l   = min(l, -dual_clip A)          only where A < 0, when dual_clip = c > 1 is given

    The dual clip bounds the loss of a token with A < 0 whose ratio has grown far above 1 (a stale
    or off-policy sample) at c |A|, so it cannot dominate the step; its gradient is then 0. verl
    applies it by default with c = 3 (`clip_ratio_c`, core_algos.compute_policy_loss_vanilla); TRL's
    GRPO has none. Returns the per-token loss (B, T), 0 at masked positions, to be reduced by
    `masked_mean` / `masked_sum`; advantages_B_T may be (B, 1) to broadcast a sample's advantage.
    Stats (detached, 0-dim token means): clip_frac (valid tokens whose gradient is zeroed by the
    PPO clip: A > 0 and rho > 1 + clip_high, or A < 0 and rho < 1 - clip_low), dual_clip_frac (A < 0
    and rho > c), approx_kl (k3 for KL(pi_old || pi)), ratio_mean.
    """
    import torch

    mask_B_T = mask_B_T.bool()
    # Zero the log-ratio under the mask before exp: padding can then never overflow into inf/NaN gradients.
    log_ratio = torch.where(mask_B_T, logprobs_B_T - old_logprobs_B_T, 0.0)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * advantages_B_T, clipped_ratio * advantages_B_T)
    negative = advantages_B_T < 0
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (the ratio bound for A < 0), got {dual_clip}")
        per_token = torch.where(negative, torch.minimum(per_token, -dual_clip * advantages_B_T), per_token)
    with torch.no_grad():
        clipped = ((advantages_B_T > 0) & (ratio > 1.0 + clip_high)) | (negative & (ratio < 1.0 - clip_low))
        stats = {
            "clip_frac": masked_mean(clipped.to(ratio.dtype), mask_B_T),
            "approx_kl": masked_mean(kl_k3(old_logprobs_B_T, logprobs_B_T), mask_B_T),
            "ratio_mean": masked_mean(ratio, mask_B_T),
        }
        if dual_clip is not None:
            stats["dual_clip_frac"] = masked_mean((negative & (ratio > dual_clip)).to(ratio.dtype), mask_B_T)
    return torch.where(mask_B_T, per_token, 0.0), stats


def entropy_from_logits(logits_B_T_V: torch.Tensor) -> torch.Tensor:
    """H_t = -sum_v p_v log p_v per position, from log_softmax in at least float32 (float64 for
    float64 logits). (B, T, V) -> (B, T).

    Logits of -inf (a masked vocabulary) contribute 0, not 0 * -inf = NaN.
    """
    import torch
    import torch.nn.functional as F

    dtype = torch.promote_types(logits_B_T_V.dtype, torch.float32)
    return entropy_from_logprobs(F.log_softmax(logits_B_T_V.to(dtype), dim=-1))


def entropy_from_logprobs(logp_B_T_V: torch.Tensor) -> torch.Tensor:
    """H_t = -sum_v p_v log p_v from log-probabilities (a log_softmax the caller already has)."""
    import torch

    return -(logp_B_T_V.exp() * logp_B_T_V.clamp_min(torch.finfo(logp_B_T_V.dtype).min)).sum(dim=-1)


def kl_penalized_rewards(
    outcome_B: torch.Tensor, kl_B_T: torch.Tensor, mask_B_T: torch.Tensor, beta: float
) -> torch.Tensor:
    """Token rewards for RLHF-style PPO (Ouyang et al. 2022 eq. 2; Stiennon et al. 2020 §3.4):

        r_t = -beta * kl_t  at every valid token,  plus the outcome reward on the last valid token.

    kl_B_T is usually k1 from rollout-time logprobs (a constant, not differentiated). -> (B, T)
    """
    import torch

    mask_B_T = mask_B_T.bool()
    counts_B_T = mask_B_T.long().cumsum(dim=-1)
    last_B_T = mask_B_T & (counts_B_T == counts_B_T[:, -1:])
    rewards = torch.where(mask_B_T, -beta * kl_B_T, 0.0)
    return rewards + torch.where(last_B_T, outcome_B[:, None].to(rewards.dtype), 0.0)
