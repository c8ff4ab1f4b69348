"""Advantage estimators behind one signature, so the RL update looks them up by name.

Every entry of `ESTIMATORS` takes an `AdvantageInputs` and returns (advantages_R_T, returns_R_T or
None): per-token advantages over the completion tokens of R = G x N sequences (prompt-major, as
`rewards_G_N.reshape(-1)`), 0 at masked positions, and the value targets for estimators that train
a value head (GAE). The formulas live in the pure functions of `advantages.py` and `value.py`; an
entry here only adapts its inputs. Adding an estimator is one function and one line in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from temper.algorithms.advantages import dr_grpo, grpo, reinforce_pp, rloo
from temper.algorithms.policy import kl_penalized_rewards
from temper.algorithms.value import gae, masked_whiten


@dataclass
class AdvantageInputs:
    """What any estimator may read. Per-token tensors are (R, T) over completion tokens."""

    rewards_G_N: torch.Tensor
    """One scalar reward per sample: G prompts x N samples."""
    mask_R_T: torch.Tensor
    """True at the completion tokens (the actions)."""
    values_R_T: torch.Tensor | None = None
    """V(s_t) of the value head before the update (GAE only)."""
    ref_kl_R_T: torch.Tensor | None = None
    """k1 = log pi_old - log ref per sampled token; None without a reference."""
    kl_coef: float = 0.0
    """beta of a KL penalty taken into the reward (0: none, e.g. when the KL is a loss term)."""
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True
    """GAE: whiten advantages over the batch's valid tokens."""
    grpo_eps: float = 1e-6
    """GRPO: epsilon added to the group std."""
    total: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Sums a tensor over data-parallel processes, for batch-wide statistics (GAE whitening,
    reinforce_pp); None: this process's rows are the batch. Groups are never split across processes."""


Estimator = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]]


def _kl_in_reward(x: AdvantageInputs) -> bool:
    return x.ref_kl_R_T is not None and x.kl_coef > 0


def outcome_estimator(advantage_G_N: Callable[[torch.Tensor], torch.Tensor]) -> Estimator:
    """An outcome estimator (one advantage per sample) broadcast over the sample's tokens.

    With a KL penalty in the reward it is taken per sequence before the group baseline, as the
    RLHF reward r - beta * sum_t k1_t (Ouyang et al. 2022 eq. 2, summed over the completion).
    """

    def estimate(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
        rewards_G_N = x.rewards_G_N
        if _kl_in_reward(x):
            penalty_R = (x.ref_kl_R_T * x.mask_R_T).sum(-1)
            rewards_G_N = rewards_G_N - x.kl_coef * penalty_R.reshape(rewards_G_N.shape)
        per_sample_R_1 = advantage_G_N(rewards_G_N).reshape(-1, 1)
        return torch.where(x.mask_R_T.bool(), per_sample_R_1, 0.0), None

    estimate.__doc__ = advantage_G_N.__doc__
    return estimate


def grpo_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """GRPO's group-normalized advantage (see `advantages.grpo`) with the configured epsilon.

    eps = 1e-6 by default, as verl (compute_grpo_outcome_advantage, `epsilon=1e-6`); TRL's
    GRPOTrainer uses 1e-4. It only matters for groups whose std is near 0 but not 0 (constant
    groups give exactly 0 either way): with rewards in {0, 1} and N >= 2 the std is >= 0.3.
    """
    return outcome_estimator(lambda r: grpo(r, eps=x.grpo_eps))(x)


def reinforce_pp_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """REINFORCE++-baseline (see `advantages.reinforce_pp`), normalized over the global batch."""
    return outcome_estimator(lambda r: reinforce_pp(r, total=x.total))(x)


def gae_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token advantages: GAE (Schulman et al. 2016) over token rewards that put the
    outcome on the last completion token and -beta k1 on every token (`kl_penalized_rewards`).

    Returns are the value targets before whitening; with `whiten` the advantages are whitened over
    the batch's valid tokens, as verl's compute_gae_advantage_return does by default (it keeps the
    policy step's scale independent of the reward scale, which the value head takes time to learn).
    """
    if x.values_R_T is None:
        raise ValueError("the gae estimator needs values (a value head)")
    beta = x.kl_coef if _kl_in_reward(x) else 0.0
    kl_R_T = x.ref_kl_R_T if x.ref_kl_R_T is not None else torch.zeros_like(x.values_R_T)
    token_rewards_R_T = kl_penalized_rewards(x.rewards_G_N.reshape(-1), kl_R_T, x.mask_R_T, beta)
    advantages_R_T, returns_R_T = gae(token_rewards_R_T, x.values_R_T, x.mask_R_T, x.gamma, x.lam)
    if x.whiten:
        advantages_R_T = masked_whiten(advantages_R_T, x.mask_R_T, total=x.total)
    return advantages_R_T, returns_R_T


ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo_estimator,
    "dr_grpo": outcome_estimator(dr_grpo),
    "rloo": outcome_estimator(rloo),
    "reinforce_pp": reinforce_pp_estimator,
    "gae": gae_estimator,
}
"""Name -> estimator; the names are `rl_config.Advantage`."""

NEEDS_VALUES = frozenset({"gae"})
"""Estimators that read `values_R_T`: the trainer adds a value head (and its loss term) for them."""
