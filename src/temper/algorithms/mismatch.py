"""Sampler/trainer mismatch: diagnostics of the per-token log-ratio and the importance weights
that correct for it (truncated or masked, per token or per sequence).

The sampler (vLLM's kernels, bf16 sampling, another backend) reports log pi_sampler(y_t) for the
tokens it drew; the trainer, with the same weights, computes log pi_trainer(y_t). They differ:

    delta_t = log pi_trainer(y_t) - log pi_sampler(y_t)        (per completion token t)

Diagnostics (`mismatch_stats`, logged every step as `mismatch/...`): the token mean of delta, the
token mean and max of |delta| (TRL's sampling/sampling_logp_difference/{mean,max}), the share of
tokens with |delta| > threshold, and two estimates of KL(pi_sampler || pi_trainer) from the
sampled tokens: k1 = mean(-delta) (verl's rollout_corr/kl) and k3 = mean(exp(delta) - 1 - delta)
(verl's rollout_corr/k3_kl, >= 0 token by token).

Correction (`correction_weights`), with r = exp(delta) per token, or per sequence
R_i = exp(sum_t delta_it) broadcast to the sequence's tokens (the product of the token ratios);
the log-ratio (token or summed) is clamped to [-20, 20] before exp, as verl does (SAFETY_BOUND):

    token_truncate:    w_t = clamp(r_t, floor, cap)                  (TIS, per token)
    token_mask:        w_t = r_t if floor <= r_t <= cap else 0       (MIS, per token)
    sequence_truncate: w_it = clamp(R_i, floor, cap)                 (TIS, per sequence)
    sequence_mask:     w_it = R_i if floor <= R_i <= cap else 0      (MIS, per sequence)

with floor None meaning no lower bound: TRL's vllm_importance_sampling_mode and its clip_max /
clip_min (trl/trainer/grpo_trainer.py, `_generate_and_score_completions`); verl's rollout_is
token / sequence with rollout_is_threshold = cap are the two truncate modes, and its
rollout_rs seq_sum_k1 with symmetric bounds "1/cap_cap" the sequence mask. The weights are
detached and multiply the per-token policy loss, whose PPO ratio is then taken against
pi_trainer at sampling time (verl's "decoupled" mode, TRL's old_per_token_logps): applying them
on top of a ratio already against pi_sampler would count the mismatch twice (verl's bypass mode
refuses that). A masked token keeps its place in the loss's denominator (TRL multiplies the loss
by a zero weight; verl's rejection sampling removes it from the mask instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Mode = Literal["off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
MODES: tuple[str, ...] = ("off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
SAFETY_BOUND = 20.0
"""|log-ratio| clamp before exp (verl's rollout_corr_helper.SAFETY_BOUND): exp(20) ~ 4.9e8."""


def log_ratio(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """delta = (log pi_trainer - log pi_sampler) on completion tokens, 0 elsewhere; (R, T)."""
    return (trainer_logp - sampler_logp) * mask


def mismatch_stats(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, threshold: float
) -> dict[str, float]:
    """The step's diagnostics over its completion tokens (see the module docstring): mean,
    mean_abs, max_abs, share_past (|delta| > threshold), kl_k1, kl_k3, and seq_max_abs (the
    largest |sum_t delta_t| of a sequence: the log of the sequence-level ratio)."""
    import torch

    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {}
    delta = log_ratio(trainer_logp, sampler_logp, mask)[m].double()
    seq = log_ratio(trainer_logp, sampler_logp, mask).double().sum(-1)[m.any(-1)]
    return {
        "mean": float(delta.mean()),
        "mean_abs": float(delta.abs().mean()),
        "max_abs": float(delta.abs().max()),
        "share_past": float((delta.abs() > threshold).double().mean()),
        "kl_k1": float((-delta).mean()),
        "kl_k3": float((torch.exp(delta) - 1 - delta).mean()),
        "seq_max_abs": float(seq.abs().max()),
        "tokens": float(n),
    }


def correction_weights(
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: Mode,
    cap: float,
    floor: float | None = None,
) -> torch.Tensor:
    """The detached per-token importance weights of `mode` (see the module docstring), (R, T),
    0 outside `mask`."""
    import torch

    if mode not in MODES or mode == "off":
        raise ValueError(f"unknown correction mode {mode!r}; valid: {', '.join(MODES[1:])}")
    delta = log_ratio(trainer_logp.detach(), sampler_logp, mask)
    if mode.startswith("sequence"):
        delta = delta.sum(-1, keepdim=True)
    ratio = torch.exp(delta.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    lo = -math.inf if floor is None else floor
    if mode.endswith("truncate"):
        w = ratio.clamp(min=floor, max=cap)
    else:
        w = ratio.masked_fill((ratio < lo) | (ratio > cap), 0.0)
    return w.expand_as(mask).to(trainer_logp.dtype) * mask


def weight_stats(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The weights' token mean and the share of completion tokens they drop (weight 0)."""
    m = mask.bool()
    if not m.any():
        return {}
    w = weights[m].double()
    return {"weight_mean": float(w.mean()), "dropped": float((w == 0).double().mean())}


@dataclass(frozen=True)
class Correction:
    """What the `rollout_correction` feature hands the update (`BatchExtras.correction`): the
    mode and bounds of the weights and the diagnostics' threshold. `mode` "off": diagnostics only."""

    mode: Mode = "off"
    cap: float = 2.0
    floor: float | None = None
    threshold: float = 0.1

    @property
    def corrects(self) -> bool:
        return self.mode != "off"

    def __call__(
        self, trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """-> (the weights, None when off; the `mismatch/...` metrics)."""
        stats = {
            f"mismatch/{k}": v
            for k, v in mismatch_stats(trainer_logp, sampler_logp, mask, self.threshold).items()
        }
        if not self.corrects:
            return None, stats
        w = correction_weights(trainer_logp, sampler_logp, mask, self.mode, self.cap, self.floor)
        return w, stats | {f"mismatch/{k}": v for k, v in weight_stats(w, mask).items()}
