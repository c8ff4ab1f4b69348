"""Advantage estimators behind one signature, so the RL update looks them up by name.

Every entry of `ESTIMATORS` is an `Estimator`: its name, its function from an `AdvantageInputs` to
(advantages_R_T, returns_R_T or None) -- per-token advantages over the completion tokens of
R = G x N sequences (prompt-major, as `rewards_G_N.reshape(-1)`; more when an episode is several
rows, `AdvantageInputs.episode_R`), 0 at masked positions, and the
value targets for estimators that train a value head (GAE) -- and what it needs: a value head, the
reference's logprobs, a group of at least `min_group` samples, named `inputs` that an RL feature
supplies (`AdvantageInputs.extra`). The config's `Advantage` choices, the value head and the group
size rule all come from this table. The formulas live in the pure functions of `advantages.py`,
`value.py`, `turns.py`, `distill.py` and `adaptthink.py`; an entry here only adapts its inputs.
Adding an estimator is one function and one line in the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from temper.algorithms.adaptthink import adaptthink_advantages
from temper.algorithms.advantages import dr_grpo, grpo, reinforce_pp, rloo
from temper.algorithms.distill import reverse_kl_advantages
from temper.algorithms.policy import kl_penalized_rewards
from temper.algorithms.turns import (
    broadcast_turns,
    per_turn_group_center,
    per_turn_group_normalize,
    turn_end_rewards,
    turn_returns,
    turn_sums,
    turn_valid,
)
from temper.algorithms.value import gae, masked_whiten

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


@dataclass
class AdvantageInputs:
    """What any estimator may read. Per-token tensors are (R, T) over completion tokens."""

    rewards_G_N: torch.Tensor
    """One scalar reward per sample: G prompts x N samples, the reward at the episode's end (the
    outcome, format etc.); the process rewards are `step_rewards_R_K` and the token rewards
    `token_rewards_R_T`, which the estimators add where each is credited."""
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
    turn_R_T: torch.Tensor | None = None
    """long: the action index k of each completion token (`Trajectory.token_turns`), -1 where the
    token is no action (environment tokens, padding). None: single-turn, every action token is turn 0."""
    step_rewards_R_K: torch.Tensor | None = None
    """The environment's process reward after action k of row r (already weighted), 0 past the row's
    last action; K = the most actions of a row in the batch. None: no process rewards."""
    turns_R: torch.Tensor | None = None
    """long: the number of actions of each row. None: 1 + the row's largest turn index."""
    turn_gamma: float = 1.0
    """Discount across turns for the turn estimators (`turns.turn_returns`)."""
    token_rewards_R_T: torch.Tensor | None = None
    """Rewards on completion tokens (already weighted; 0 elsewhere), e.g. a process reward model's
    step scores on the tokens that end the steps. GAE adds them to its token rewards; the turn
    estimators to the process reward of the turn that holds the token; the outcome estimators to
    the sample's reward (the episode's undiscounted return). None: none."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Named inputs of the estimators that declare them (`Estimator.inputs`), supplied by the RL
    feature that goes with the estimator (e.g. AdaptThink's `direct_R`, `ref_accuracy_G`, `delta`)."""
    episode_R: torch.Tensor | None = None
    """long (R,): the episode (index into `rewards_G_N.reshape(-1)`) of each row, when an episode
    is several rows (an agent that rewrote its history, `Trajectory.rows`; its rows consecutive).
    None: row r is episode r."""


EstimateFn = Callable[[AdvantageInputs], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator: its function and what it needs. Calling it checks that the inputs
    hold what it declares (the recipe's rules make sure a run gives it), then estimates."""

    name: str
    fn: EstimateFn
    needs_values: bool = False
    """It reads `values_R_T`: the trainer adds a value head (and its loss term) for it."""
    needs_reference: bool = False
    """It reads `ref_kl_R_T`: the run needs a reference (a teacher) and kl_coef > 0."""
    min_group: int = 1
    """Samples per prompt below which it learns nothing (its baseline is the rest of the group)."""
    inputs: tuple[str, ...] = ()
    """Names it reads from `AdvantageInputs.extra`, supplied by an RL feature."""
    segment_rows: bool = False
    """It takes episodes of several rows (`AdvantageInputs.episode_R`): the outcome estimators,
    one advantage per episode given to each of its rows, and the per-token ones. GAE and the turn
    estimators read a row as a whole episode (its last token the outcome's, its turns all the
    episode's) and refuse them."""

    def __call__(self, x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.needs_values and x.values_R_T is None:
            raise ValueError(f"the {self.name} estimator needs values (a value head)")
        if self.needs_reference and x.ref_kl_R_T is None:
            raise ValueError(
                f"the {self.name} estimator needs the reference's logprobs (a teacher and kl_coef > 0)"
            )
        if missing := [k for k in self.inputs if x.extra.get(k) is None]:
            raise ValueError(
                f"the {self.name} estimator needs {', '.join(missing)} (its feature supplies them)"
            )
        if x.episode_R is not None and not self.segment_rows:
            raise ValueError(
                f"the {self.name} estimator reads each row as a whole episode, and an episode here "
                "is several rows (an agent rewrote its history): use grpo, dr_grpo, rloo or reinforce_pp"
            )
        return self.fn(x)


def _kl_in_reward(x: AdvantageInputs) -> bool:
    return x.ref_kl_R_T is not None and x.kl_coef > 0


def _per_episode(x: AdvantageInputs, per_row_R: torch.Tensor) -> torch.Tensor:
    """A per-row total summed over each episode's rows -> (G, N)."""
    if x.episode_R is None:
        return per_row_R.reshape(x.rewards_G_N.shape)
    total = per_row_R.new_zeros(x.rewards_G_N.numel()).index_add_(0, x.episode_R, per_row_R)
    return total.reshape(x.rewards_G_N.shape)


def outcome_estimator(advantage_G_N: Callable[[torch.Tensor], torch.Tensor]) -> EstimateFn:
    """An outcome estimator (one advantage per sample) broadcast over the sample's tokens.

    A sample is an episode: with several rows (`episode_R`) its per-row sums (process, token
    rewards, KL) are added up over its rows, the group baseline is over the group's episodes,
    and each row gets its episode's advantage.

    With process rewards a sample's reward is the episode's undiscounted total return, outcome +
    sum_k step_rewards_k (turn_gamma is for the turn estimators), and with token rewards also
    + sum_t token_rewards_t. With a KL penalty in the reward it
    is taken per sequence before the group baseline, as the RLHF reward r - beta * sum_t k1_t
    (Ouyang et al. 2022 eq. 2, summed over the completion).
    """

    def estimate(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
        import torch

        rewards_G_N = x.rewards_G_N
        if x.step_rewards_R_K is not None:
            rewards_G_N = rewards_G_N + _per_episode(x, x.step_rewards_R_K.sum(-1)).to(rewards_G_N.dtype)
        if x.token_rewards_R_T is not None:
            rewards_G_N = rewards_G_N + _per_episode(x, (x.token_rewards_R_T * x.mask_R_T).sum(-1)).to(
                rewards_G_N.dtype
            )
        if _kl_in_reward(x):
            penalty_R = (x.ref_kl_R_T * x.mask_R_T).sum(-1)
            rewards_G_N = rewards_G_N - x.kl_coef * _per_episode(x, penalty_R)
        per_sample_R_1 = advantage_G_N(rewards_G_N).reshape(-1, 1)
        if x.episode_R is not None:
            per_sample_R_1 = per_sample_R_1[x.episode_R]
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


def _turn_layout(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(turn_R_T, step_rewards_R_K, turns_R) with the single-turn defaults filled in: without turns
    every row is one action (turn 0 on its action tokens), without process rewards they are 0.
    turn_R_T is -1 wherever the mask is off, so only action tokens ever carry credit."""
    import torch

    mask_R_T = x.mask_R_T.bool()
    given = x.step_rewards_R_K
    if x.turn_R_T is None and given is not None and given.shape[1] > 1:
        raise ValueError("process rewards for more than one turn need turn_R_T (which tokens each turn is)")
    if x.turn_R_T is None:
        turn_R_T = torch.where(mask_R_T, 0, -1)
        turns_R = torch.ones(mask_R_T.shape[0], dtype=torch.long, device=mask_R_T.device)
    else:
        turn_R_T = x.turn_R_T.long()
        turns_R = x.turns_R.long() if x.turns_R is not None else turn_R_T.amax(dim=-1).clamp_min(-1) + 1
    k_count = max(int(turns_R.max()) if turns_R.numel() else 0, 1, given.shape[1] if given is not None else 0)
    dtype = x.rewards_G_N.dtype if x.rewards_G_N.is_floating_point() else torch.get_default_dtype()
    step_R_K = torch.zeros(len(turns_R), k_count, dtype=dtype, device=mask_R_T.device)
    if given is not None:
        step_R_K[:, : given.shape[1]] = given
    return torch.where(mask_R_T, turn_R_T, -1), step_R_K, turns_R


def turn_estimator(per_turn_G_N_K: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> EstimateFn:
    """A turn-level estimator: each row's return from every turn (`turns.turn_returns`: outcome and
    process rewards discounted by turn_gamma), compared within the prompt's group at the same turn
    index by `per_turn_G_N_K(returns_G_N_K, valid_G_N_K)`, and given to the tokens of that turn.

    With a KL penalty in the reward, -beta * (the sum of k1 over turn k's tokens) is added to turn
    k's process reward; single-turn, that is the outcome estimators' per-sequence penalty. Token
    rewards are added the same way: the sum over turn k's tokens to turn k's process reward.
    """

    def estimate(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
        turn_R_T, step_R_K, turns_R = _turn_layout(x)
        k_count = step_R_K.shape[1]
        if x.token_rewards_R_T is not None:
            step_R_K = step_R_K + turn_sums(
                (x.token_rewards_R_T * x.mask_R_T).to(step_R_K.dtype), turn_R_T, k_count
            )
        if _kl_in_reward(x):
            step_R_K = step_R_K - x.kl_coef * turn_sums(x.ref_kl_R_T * x.mask_R_T, turn_R_T, k_count)
        g, n = x.rewards_G_N.shape
        returns_G_N_K = turn_returns(step_R_K, x.rewards_G_N.reshape(-1), turns_R, x.turn_gamma).reshape(
            g, n, k_count
        )
        valid_G_N_K = turn_valid(turns_R, k_count).reshape(g, n, k_count)
        per_turn_R_K = per_turn_G_N_K(returns_G_N_K, valid_G_N_K).reshape(g * n, k_count)
        return broadcast_turns(per_turn_R_K, turn_R_T), None

    return estimate


def turn_grpo_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """GRPO per turn index: A_{r,k} = (G_{r,k} - mean_k) / (std_k + eps) over the group's rows that
    have turn k (`turns.per_turn_group_normalize`), eps = grpo_eps. Single-turn, it is grpo exactly."""
    return turn_estimator(lambda returns, valid: per_turn_group_normalize(returns, valid, x.grpo_eps))(x)


def turn_reinforce_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """REINFORCE with a per-turn group-mean baseline and no std division (Dr. GRPO's advantage, Liu et
    al. 2025, per turn index): A_{r,k} = G_{r,k} - mean_k over the group's rows that have turn k
    (`turns.per_turn_group_center`). Single-turn, it is dr_grpo."""
    return turn_estimator(per_turn_group_center)(x)


def gae_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token advantages: GAE (Schulman et al. 2016) over token rewards that put the
    outcome on the last completion token, process reward k on the last token of action k
    (`turns.turn_end_rewards`), -beta k1 on every token (`kl_penalized_rewards`) and the given
    token rewards on their tokens (a process reward model's step scores, dense):

        r_t = outcome [t = last] + s_k [t = end of action k] - beta k1_t + token_reward_t

    Returns are the value targets before whitening; with `whiten` the advantages are whitened over
    the batch's valid tokens, as verl's compute_gae_advantage_return does by default (it keeps the
    policy step's scale independent of the reward scale, which the value head takes time to learn).
    """
    import torch

    beta = x.kl_coef if _kl_in_reward(x) else 0.0
    kl_R_T = x.ref_kl_R_T if x.ref_kl_R_T is not None else torch.zeros_like(x.values_R_T)
    token_rewards_R_T = kl_penalized_rewards(x.rewards_G_N.reshape(-1), kl_R_T, x.mask_R_T, beta)
    if x.step_rewards_R_K is not None:
        turn_R_T, step_R_K, _ = _turn_layout(x)
        token_rewards_R_T = token_rewards_R_T + turn_end_rewards(step_R_K, turn_R_T).to(
            token_rewards_R_T.dtype
        )
    if x.token_rewards_R_T is not None:
        token_rewards_R_T = token_rewards_R_T + (x.token_rewards_R_T * x.mask_R_T).to(token_rewards_R_T.dtype)
    advantages_R_T, returns_R_T = gae(token_rewards_R_T, x.values_R_T, x.mask_R_T, x.gamma, x.lam)
    if x.whiten:
        advantages_R_T = masked_whiten(advantages_R_T, x.mask_R_T, total=x.total)
    return advantages_R_T, returns_R_T


def on_policy_distill_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """On-policy distillation (see `distill.reverse_kl_advantages`): the reference is the teacher,
    `ref_kl_R_T` its k1 per sampled token and `kl_coef` the scale; the rewards are not used (they are
    still logged, so the verifier shows whether distillation reaches the teacher's accuracy)."""
    return reverse_kl_advantages(x.ref_kl_R_T, x.mask_R_T, x.kl_coef, x.total), None


def adaptthink_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """AdaptThink (see `adaptthink.adaptthink_advantages`): delta * 1(direct) + r - Rbar_ref(x) per
    sample, broadcast over its tokens; the rewards are the whole reward (outcome, format...). Its
    inputs (`direct_R`: bool (R,), the sample answered in the direct mode; `ref_accuracy_G`: (G,),
    the reference model's mean accuracy on each prompt; `delta`) come from the adaptthink feature
    (`temper.train.features.adaptthink`), whose rules keep a KL and process rewards out of it."""
    import torch

    direct_G_N = x.extra["direct_R"].reshape(x.rewards_G_N.shape)
    per_sample_R_1 = adaptthink_advantages(
        x.rewards_G_N, direct_G_N, x.extra["ref_accuracy_G"], x.extra["delta"]
    ).reshape(-1, 1)
    return torch.where(x.mask_R_T.bool(), per_sample_R_1, 0.0), None


ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("grpo", grpo_estimator, min_group=2, segment_rows=True),
        Estimator("dr_grpo", outcome_estimator(dr_grpo), min_group=2, segment_rows=True),
        Estimator("rloo", outcome_estimator(rloo), min_group=2, segment_rows=True),
        Estimator("reinforce_pp", reinforce_pp_estimator, min_group=2, segment_rows=True),
        Estimator("gae", gae_estimator, needs_values=True),
        Estimator("turn_grpo", turn_grpo_estimator, min_group=2),
        Estimator("turn_reinforce", turn_reinforce_estimator, min_group=2),
        Estimator("on_policy_distill", on_policy_distill_estimator, needs_reference=True, segment_rows=True),
        Estimator("adaptthink", adaptthink_estimator, inputs=("direct_R", "ref_accuracy_G", "delta")),
    )
}
"""Name -> estimator; the names are `rl_config.Advantage`."""

NEEDS_VALUES = frozenset(name for name, e in ESTIMATORS.items() if e.needs_values)
"""Estimators that read `values_R_T`: the trainer adds a value head (and its loss term) for them."""
GROUP_ESTIMATORS = tuple(name for name, e in ESTIMATORS.items() if e.min_group > 1)
"""Estimators whose baseline is the other samples of the prompt's group: with one sample the
advantage is 0 and nothing is learned (`temper.algorithms.advantages`)."""
