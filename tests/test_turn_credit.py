"""Process rewards and turn-level credit (`temper.algorithms.turns` and the turn estimators) against
hand-computed values on a 2-prompt x 2-sample batch of 1-3 turns with environment tokens between
the turns, and the single-turn case against the outcome estimators."""

import math

import pydantic
import pytest
import torch

from temper.algorithms.advantages import grpo
from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
from temper.algorithms.turns import (
    broadcast_turns,
    per_turn_group_center,
    per_turn_group_normalize,
    turn_end_rewards,
    turn_returns,
    turn_sums,
)
from temper.train.rl_config import RLConfig, rl_rules

F64 = torch.float64
H = 1 / math.sqrt(2)  # GRPO's advantage in a group of two different returns (unbiased std)

# rows: (prompt 0: samples 0, 1), (prompt 1: samples 0, 1); -1 = environment tokens and padding
TURN_R_T = torch.tensor(
    [
        [0, 0, -1, -1, 1, -1, 2, 2],  # 3 actions, tool results between them
        [0, -1, 1, 1, -1, -1, -1, -1],  # 2 actions, then padding
        [0, 0, 0, -1, -1, -1, -1, -1],  # 1 action
        [0, -1, -1, 1, 1, 1, -1, -1],  # 2 actions
    ]
)
STEP_R_K = torch.tensor([[0.1, 0.2, 0.3], [0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [0.2, 0.9, 0.0]], dtype=F64)
OUTCOME_G_N = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
TURNS_R = torch.tensor([3, 2, 1, 2])
# G_{r,k} = sum_{j>=k} gamma^(j-k) s_j + gamma^(K_r-1-k) o, by hand
RETURNS = {
    1.0: [[1.6, 1.5, 1.3], [0.0, -0.5, 0.0], [1.0, 0.0, 0.0], [1.1, 0.9, 0.0]],
    0.5: [[0.525, 0.85, 1.3], [0.25, -0.5, 0.0], [1.0, 0.0, 0.0], [0.65, 0.9, 0.0]],
}


def _inputs(**kw) -> AdvantageInputs:
    base = dict(
        rewards_G_N=OUTCOME_G_N,
        mask_R_T=TURN_R_T >= 0,
        turn_R_T=TURN_R_T,
        step_rewards_R_K=STEP_R_K,
        turns_R=TURNS_R,
        grpo_eps=0.0,
    )
    return AdvantageInputs(**(base | kw))


def _tokens(per_turn_R_K) -> torch.Tensor:
    """Hand broadcast: row r's token t gets per_turn[r][turn], 0 at turn -1."""
    return torch.tensor(
        [[per_turn_R_K[r][k] if k >= 0 else 0.0 for k in row] for r, row in enumerate(TURN_R_T.tolist())],
        dtype=F64,
    )


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_turn_returns_by_hand(gamma):
    got = turn_returns(STEP_R_K, OUTCOME_G_N.reshape(-1), TURNS_R, gamma)
    torch.testing.assert_close(got, torch.tensor(RETURNS[gamma], dtype=F64))


def test_turn_returns_ignore_rewards_past_the_rows_turns_and_need_room_for_them():
    garbage = STEP_R_K + torch.tensor(
        [[0.0, 0.0, 0.0], [0.0, 0.0, 7.0], [0.0, 5.0, 5.0], [0.0, 0.0, 3.0]], dtype=F64
    )
    got = turn_returns(garbage, OUTCOME_G_N.reshape(-1), TURNS_R, 1.0)
    torch.testing.assert_close(got, torch.tensor(RETURNS[1.0], dtype=F64))
    with pytest.raises(ValueError, match="turns"):
        turn_returns(STEP_R_K[:, :2], OUTCOME_G_N.reshape(-1), TURNS_R, 1.0)


def test_per_turn_group_normalize_uses_only_the_rows_having_the_turn():
    # one group of 4: turn 0 all valid (grpo itself); turn 1 three valid, the invalid 100 must not count
    returns = torch.tensor([[[1.0, 0.0], [2.0, 1.0], [4.0, 5.0], [3.0, 100.0]]], dtype=F64)
    valid = torch.tensor([[[True, True], [True, True], [True, True], [True, False]]])
    got = per_turn_group_normalize(returns, valid, eps=0.0)
    torch.testing.assert_close(got[..., 0], grpo(returns[..., 0], eps=0.0))
    # turn 1: mean 2, centered (-2, -1, 3), unbiased var 14 / 2 = 7
    s7 = math.sqrt(7)
    torch.testing.assert_close(got[..., 1], torch.tensor([[-2 / s7, -1 / s7, 3 / s7, 0.0]], dtype=F64))


def test_per_turn_group_normalize_is_zero_for_one_row_and_for_equal_returns():
    returns = torch.tensor([[[1.0, 2.0, 5.0], [3.0, 2.0, 9.0]]], dtype=F64)
    valid = torch.tensor([[[True, True, True], [True, True, False]]])
    got = per_turn_group_normalize(returns, valid, eps=0.0)
    torch.testing.assert_close(got[0, :, 0], torch.tensor([-H, H], dtype=F64))
    assert (got[0, :, 1:] == 0).all()  # equal returns; a turn only one row has
    assert not got.isnan().any()


def test_equal_returns_give_exactly_zero_not_rounding_noise():
    # 3 x 0.1 sums to 0.30000000000000004: the mean is not 0.1 and (x - mean) / std would be 0 / 0
    returns = torch.tensor([[[0.1], [0.1], [0.1], [5.0]]], dtype=F64)
    valid = torch.tensor([[[True], [True], [True], [False]]])
    assert (per_turn_group_normalize(returns, valid, eps=0.0) == 0).all()
    assert (per_turn_group_center(returns, valid) == 0).all()


def test_per_turn_group_center_by_hand():
    returns = torch.tensor([[[1.0, 0.0], [2.0, 1.0], [6.0, 5.0], [3.0, 100.0]]], dtype=F64)
    valid = torch.tensor([[[True, True], [True, False], [True, True], [True, False]]])
    got = per_turn_group_center(returns, valid)
    # turn 0: mean 3; turn 1: rows 0 and 2, mean 2.5
    torch.testing.assert_close(
        got[0], torch.tensor([[-2.0, -2.5], [-1.0, 0.0], [3.0, 2.5], [0.0, 0.0]], dtype=F64)
    )


def test_broadcast_turns_gives_each_token_its_turns_value_and_environment_tokens_zero():
    values = torch.tensor([[10.0, 20.0, 30.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
    torch.testing.assert_close(broadcast_turns(values, TURN_R_T), _tokens(values.tolist()))


def test_turn_sums_and_turn_end_rewards_by_hand():
    x = torch.arange(1.0, 9.0, dtype=F64).expand(4, 8)
    torch.testing.assert_close(
        turn_sums(x, TURN_R_T, 3),
        torch.tensor([[3.0, 5.0, 15.0], [1.0, 7.0, 0.0], [6.0, 0.0, 0.0], [1.0, 15.0, 0.0]], dtype=F64),
    )
    expected = torch.zeros(4, 8, dtype=F64)
    expected[0, [1, 4, 7]] = torch.tensor([0.1, 0.2, 0.3], dtype=F64)  # the last token of each action
    expected[1, [0, 3]] = torch.tensor([0.5, -0.5], dtype=F64)
    expected[3, [0, 5]] = torch.tensor([0.2, 0.9], dtype=F64)
    torch.testing.assert_close(turn_end_rewards(STEP_R_K, TURN_R_T), expected)


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_turn_reinforce_by_hand(gamma):
    per_turn = {  # the return minus the group's mean return at the same turn; 0 for a turn one row has
        1.0: [[0.8, 1.0, 0.0], [-0.8, -1.0, 0.0], [-0.05, 0.0, 0.0], [0.05, 0.0, 0.0]],
        0.5: [[0.1375, 0.675, 0.0], [-0.1375, -0.675, 0.0], [0.175, 0.0, 0.0], [-0.175, 0.0, 0.0]],
    }[gamma]
    advantages, returns = ESTIMATORS["turn_reinforce"](_inputs(turn_gamma=gamma))
    assert returns is None
    torch.testing.assert_close(advantages, _tokens(per_turn))


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_turn_grpo_by_hand(gamma):
    # groups of two: +-1/sqrt(2) by the sign of the difference; the discount flips prompt 1
    # (returns 1.0 vs 1.1 undiscounted, 1.0 vs 0.65 at gamma 0.5)
    sign = 1.0 if gamma == 1.0 else -1.0
    per_turn = [[H, H, 0.0], [-H, -H, 0.0], [-sign * H, 0.0, 0.0], [sign * H, 0.0, 0.0]]
    advantages, _ = ESTIMATORS["turn_grpo"](_inputs(turn_gamma=gamma))
    torch.testing.assert_close(advantages, _tokens(per_turn))


def test_turns_r_defaults_to_the_turn_indices():
    given = ESTIMATORS["turn_grpo"](_inputs(turn_gamma=0.5))[0]
    torch.testing.assert_close(ESTIMATORS["turn_grpo"](_inputs(turn_gamma=0.5, turns_R=None))[0], given)


@pytest.mark.parametrize("name", ["turn_grpo", "turn_reinforce", "grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_environment_tokens_get_no_advantage_even_if_the_mask_lets_them_through(name):
    advantages, _ = ESTIMATORS[name](_inputs())
    assert (advantages[TURN_R_T < 0] == 0).all()
    if name.startswith("turn_"):  # a token needs both a turn and the mask to carry credit
        loose, _ = ESTIMATORS[name](_inputs(mask_R_T=torch.ones_like(TURN_R_T, dtype=torch.bool)))
        torch.testing.assert_close(loose, advantages)
        mask = TURN_R_T >= 0
        mask[1, 3] = False  # e.g. a token the loop keeps out of the loss
        masked, _ = ESTIMATORS[name](_inputs(mask_R_T=mask))
        assert masked[1, 3] == 0 and masked[1, 2] == advantages[1, 2] != 0


def _single_turn_inputs(dtype, **kw) -> AdvantageInputs:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 7, (4 * 5,), generator=g)
    mask = torch.arange(7)[None, :] < lengths[:, None]
    rewards = torch.rand(4, 5, generator=g, dtype=dtype)
    rewards[1] = (rewards[1] > 0.5).to(dtype)
    rewards[2] = 0.5  # a constant group
    return AdvantageInputs(rewards_G_N=rewards, mask_R_T=mask, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("given", [True, False])
def test_single_turn_turn_grpo_is_exactly_grpo(dtype, given):
    x = _single_turn_inputs(dtype)
    if given:  # what the multi-turn loop passes for one-step episodes
        x.turn_R_T = torch.where(x.mask_R_T, 0, -1)
        x.step_rewards_R_K = torch.zeros(20, 1, dtype=dtype)
        x.turns_R = torch.ones(20, dtype=torch.long)
    assert torch.equal(ESTIMATORS["turn_grpo"](x)[0], ESTIMATORS["grpo"](x)[0])
    torch.testing.assert_close(ESTIMATORS["turn_reinforce"](x)[0], ESTIMATORS["dr_grpo"](x)[0])


def test_single_turn_kl_in_the_reward_matches_the_outcome_estimators():
    x = _single_turn_inputs(F64, kl_coef=0.5)
    x.ref_kl_R_T = (
        0.1 * torch.randn(20, 7, generator=torch.Generator().manual_seed(2), dtype=F64) * x.mask_R_T
    )
    torch.testing.assert_close(ESTIMATORS["turn_grpo"](x)[0], ESTIMATORS["grpo"](x)[0])
    assert not torch.allclose(
        ESTIMATORS["turn_grpo"](x)[0], ESTIMATORS["turn_grpo"](_single_turn_inputs(F64))[0]
    )


def test_kl_in_the_reward_is_charged_to_the_turn_that_incurred_it():
    kl = torch.zeros(4, 8, dtype=F64)
    kl[1, 2] = 0.4  # row 1, action 1
    got, _ = ESTIMATORS["turn_reinforce"](_inputs(ref_kl_R_T=kl, kl_coef=0.5))
    # row 1's turn-1 return drops by 0.2 (so does its turn-0 return, gamma 1): prompt 0's turn 0
    # mean is 0.7 (1.6 vs -0.2), turn 1's 0.4 (1.5 vs -0.7)
    torch.testing.assert_close(
        got, _tokens([[0.9, 1.1, 0.0], [-0.9, -1.1, 0.0], [-0.05, 0.0, 0.0], [0.05, 0.0, 0.0]])
    )


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_outcome_estimators_use_the_episodes_total_return(name):
    totals = OUTCOME_G_N + STEP_R_K.sum(-1).reshape(2, 2)  # 1.6, 0.0 | 1.0, 1.1
    with_steps, _ = ESTIMATORS[name](_inputs())
    on_totals, _ = ESTIMATORS[name](_inputs(rewards_G_N=totals, step_rewards_R_K=None))
    torch.testing.assert_close(with_steps, on_totals)
    if name == "dr_grpo":
        torch.testing.assert_close(with_steps[:, 0], torch.tensor([0.8, -0.8, -0.05, 0.05], dtype=F64))


@pytest.mark.parametrize(
    ("gamma", "advantages"),
    [(1.0, [1.65, 1.55, 0.0, 0.95, 0.85]), (0.5, [0.30625, 0.6125, 0.0, 0.325, 0.85])],
)
def test_gae_puts_each_process_reward_on_the_last_token_of_its_action(gamma, advantages):
    # one row: action 0 = tokens 0-1, a tool result at 2, action 1 = tokens 3-4; lam = 1, so the
    # advantage is the discounted reward-to-go over the action tokens minus V:
    # token rewards (0, 0.5, -, 0, 0.25 + outcome 1)
    turn = torch.tensor([[0, 0, -1, 1, 1]])
    x = AdvantageInputs(
        rewards_G_N=torch.tensor([[1.0]], dtype=F64),
        mask_R_T=turn >= 0,
        values_R_T=torch.tensor([[0.1, 0.2, 9.0, 0.3, 0.4]], dtype=F64),
        turn_R_T=turn,
        step_rewards_R_K=torch.tensor([[0.5, 0.25]], dtype=F64),
        turns_R=torch.tensor([2]),
        gamma=gamma,
        lam=1.0,
        whiten=False,
    )
    got, returns = ESTIMATORS["gae"](x)
    torch.testing.assert_close(got, torch.tensor([advantages], dtype=F64))
    torch.testing.assert_close(returns, torch.where(x.mask_R_T, got + x.values_R_T, 0.0))


@pytest.mark.parametrize("name", ["turn_grpo", "gae"])
def test_several_turns_of_process_rewards_without_turns_are_refused(name):
    with pytest.raises(ValueError, match="turn_R_T"):
        ESTIMATORS[name](_inputs(turn_R_T=None, values_R_T=torch.zeros(4, 8, dtype=F64)))


def test_turn_estimators_need_groups_and_turn_gamma_is_a_discount():
    assert rl_rules(RLConfig(advantage="turn_grpo", group_size=1))
    assert not rl_rules(RLConfig(advantage="turn_reinforce", group_size=2, turn_gamma=0.5))
    assert [loc for loc, _ in rl_rules(RLConfig(advantage="grpo", turn_gamma=0.5))] == [
        ("train", "turn_gamma")
    ]
    adapter = pydantic.TypeAdapter(RLConfig)
    assert adapter.validate_python({"advantage": "turn_grpo", "turn_gamma": 0.9}).turn_gamma == 0.9
    with pytest.raises(pydantic.ValidationError, match="turn_gamma"):
        adapter.validate_python({"turn_gamma": 1.5})
