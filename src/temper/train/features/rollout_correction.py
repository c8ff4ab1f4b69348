"""Sampler/trainer mismatch as an RL feature, `rollout_correction: {mode, cap, floor, threshold}`
(the math is `temper.algorithms.mismatch`; the mode names and cap/floor are TRL's
`vllm_importance_sampling_mode` / `_clip_max` / `_clip_min`, the cap's default verl's
`rollout_is_threshold`).

Every step, whatever the mode, the update computes the trainer's logprobs of the sampled tokens
at the sampling weights (read off the update's first forward for one epoch of one minibatch
without dropout, else one no-grad forward in `prepare`, shared with PPO's value pass) and logs
`mismatch/{mean, mean_abs, max_abs, share_past, kl_k1, kl_k3, seq_max_abs, tokens}` of
delta = log pi_trainer - log pi_sampler. With a mode other than `off` the policy loss is the
decoupled one: its PPO ratio is against pi_trainer at sampling time, and each token's loss is
multiplied by the truncated (or masked) weight pi_trainer / pi_sampler, with
`mismatch/{weight_mean, dropped}` logged too.

Refused at the recipe: a correction with `top_p` < 1. The sampler draws from the nucleus,
renormalized, so the probability it sampled a kept token with is pi / S (S: the kept mass) while
the logprob it reports (as vLLM's processed logprobs or temper's HF sampler) is not that; the
weight would be biased by log S on every token (TRL #6789). The diagnostics alone stay allowed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from temper.algorithms.mismatch import Correction, Mode
from temper.train.features.base import BatchExtras, Error, Hooks, RLFeature, RunStart, Step


@dataclass
class RolloutCorrection:
    """Sampler/trainer mismatch: diagnostics every step, and optionally importance weights."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    mode: Mode = "off"
    """off (diagnostics only) | token_truncate | token_mask | sequence_truncate | sequence_mask:
    truncated (TIS) or masked (MIS) importance weights pi_trainer / pi_sampler per token, or per
    sequence (the product over its tokens), as TRL's vllm_importance_sampling_mode."""
    cap: Annotated[float, Field(gt=0)] = 2.0
    """C_max: truncate modes clip the weight at it, mask modes drop what is above (verl's
    rollout_is_threshold 2.0; TRL's vllm_importance_sampling_clip_max defaults to 3.0)."""
    floor: Annotated[float, Field(ge=0)] | None = None
    """C_min: truncate modes raise the weight to it, mask modes drop what is below (null: no lower
    bound, TRL's default)."""
    threshold: Annotated[float, Field(gt=0)] = 0.1
    """|log pi_trainer - log pi_sampler| past which a token counts in mismatch/share_past."""
    diagnostics: bool = True
    """Log the mismatch every step (a no-grad forward per step unless the update's own serves,
    see `rl_update.diagnose_in_update`; off: no metrics; a correction needs it)."""

    def correction(self) -> Correction:
        return Correction(self.mode, self.cap, self.floor, self.threshold)


def rules(config: Any, stage: Any) -> list[Error]:
    block: RolloutCorrection = config.rollout_correction
    out: list[Error] = []
    if block.mode == "off":
        return out
    if not block.diagnostics:
        out.append(
            (
                ("train", "rollout_correction", "diagnostics"),
                f"mode {block.mode!r} needs the trainer's logprobs at sampling time: leave diagnostics on",
            )
        )
    if block.floor is not None and block.floor >= block.cap:
        out.append(
            (
                ("train", "rollout_correction", "floor"),
                f"{block.floor} must be below cap ({block.cap}): every weight would be {block.cap} or dropped",
            )
        )
    if config.top_p < 1.0 and config.temperature > 0:
        out.append(
            (
                ("train", "top_p"),
                f"top_p {config.top_p} with rollout_correction mode {block.mode!r}: the sampler draws from the "
                "renormalized nucleus, so the weight pi_trainer / pi_sampler would be off by the log of the kept "
                "mass on every token (TRL #6789); use top_p: 1, or mode: off (diagnostics only)",
            )
        )
    return out


class Diagnose(Hooks):
    """Hands the update its correction (mode `off`: the diagnostics only) every step."""

    def __init__(self, correction: Correction):
        self.correction = correction

    def extras(self, step: Step, batch: Any) -> BatchExtras:
        return BatchExtras(correction=self.correction)


def start(config: Any, run: RunStart) -> Hooks | None:
    block: RolloutCorrection = config.rollout_correction
    return Diagnose(block.correction()) if block.diagnostics else None


def describe(config: Any) -> str:
    block: RolloutCorrection = config.rollout_correction
    if block.mode == "off":
        return ""
    bounds = f"cap {block.cap}" + (f", floor {block.floor}" if block.floor is not None else "")
    return f", rollout correction {block.mode} ({bounds})"


FEATURE = RLFeature(
    name="rollout_correction",
    block=RolloutCorrection,
    default=RolloutCorrection,
    doc="Sampler/trainer mismatch: mismatch/... diagnostics every step and optional truncated or "
    "masked importance weights (token or sequence level) on the policy loss.",
    order=80,
    rules=rules,
    describe=describe,
    summary=lambda config, folder: {"rollout_correction": asdict(config.rollout_correction)},
    start=start,
    hashed_when_set=True,
)
