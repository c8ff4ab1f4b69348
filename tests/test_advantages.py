import math

import pytest
import torch

from temper.algorithms.advantages import dr_grpo, grpo, reinforce_pp, rloo

OUTCOME = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "reinforce_pp": reinforce_pp}

# One prompt solved once in four samples: mean 0.25, centered (0.75, -0.25, -0.25, -0.25),
# unbiased variance (0.5625 + 3 * 0.0625) / 3 = 0.25, so std = 0.5.
ONE_OF_FOUR = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


def test_grpo_divides_by_unbiased_group_std():
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5]], dtype=torch.float64)
    torch.testing.assert_close(grpo(ONE_OF_FOUR, eps=0.0), expected)


def test_grpo_groups_are_independent():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [3.0, 5.0, 3.0, 5.0]], dtype=torch.float64)
    # second group: mean 4, centered (-1, 1, -1, 1), unbiased std sqrt(4 / 3)
    s = math.sqrt(4 / 3)
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5], [-1 / s, 1 / s, -1 / s, 1 / s]], dtype=torch.float64)
    torch.testing.assert_close(grpo(rewards, eps=0.0), expected)


def test_dr_grpo_only_subtracts_the_group_mean():
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64)
    torch.testing.assert_close(dr_grpo(ONE_OF_FOUR), expected)


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # r_0 - mean(0, 0, 0) = 1;  r_1 - mean(1, 0, 0) = -1/3
    expected = torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64)
    torch.testing.assert_close(rloo(ONE_OF_FOUR), expected)
    rewards = torch.tensor([[0.3, 0.9, -0.4]], dtype=torch.float64)
    loop = [rewards[0, i] - (rewards[0].sum() - rewards[0, i]) / 2 for i in range(3)]
    torch.testing.assert_close(rloo(rewards), torch.stack(loop)[None])


def test_reinforce_pp_baseline_normalizes_by_the_batch_std():
    rewards = torch.tensor(
        [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64
    )
    centered = torch.tensor(
        [[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64
    )
    # batch mean 0; biased batch variance over all 12 samples: (0.5625 + 3 * 0.0625 + 4 * 0.25) / 12
    std = math.sqrt((0.5625 + 3 * 0.0625 + 4 * 0.25) / 12)
    torch.testing.assert_close(reinforce_pp(rewards, eps=0.0), centered / std)


def test_reinforce_pp_without_baseline_normalizes_raw_rewards_over_the_batch():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [3.0]], dtype=torch.float64)  # N = 1
    # mean 1, deviations (0, -1, -1, 2), biased variance 6 / 4
    expected = torch.tensor([[0.0], [-1.0], [-1.0], [2.0]], dtype=torch.float64) / math.sqrt(1.5)
    torch.testing.assert_close(reinforce_pp(rewards, group_baseline=False, eps=0.0), expected)


@pytest.mark.parametrize("name", sorted(OUTCOME))
def test_constant_groups_give_exactly_zero(name):
    # In float32 the mean of three copies of 0.37029093 is off by one ulp, so a naive r - mean is 3e-8 and
    # naive GRPO gives 3e-8 / (3.7e-8 + 1e-6) = 0.03 instead of 0.
    v = 0.37029093503952026
    rewards = torch.tensor([[v, v, v], [0.7, 0.7, 0.7], [1.0, 0.0, 0.0]])
    assert (rewards[:1] - rewards[:1].mean()).abs().max() > 0
    adv = OUTCOME[name](rewards)
    assert torch.isfinite(adv).all()
    assert (adv[:2] == 0).all()
    assert (adv[2] != 0).all()


@pytest.mark.parametrize("name", sorted(OUTCOME))
def test_all_constant_batch_gives_zero_not_nan(name):
    adv = OUTCOME[name](torch.ones(2, 4))
    assert (adv == 0).all()


@pytest.mark.parametrize("fn", [grpo, dr_grpo, rloo, reinforce_pp])
def test_group_estimators_need_two_samples(fn):
    with pytest.raises(ValueError):
        fn(torch.ones(3, 1))
    with pytest.raises(ValueError):
        fn(torch.ones(4))


def test_integer_rewards_are_accepted_and_shape_is_kept():
    adv = grpo(torch.tensor([[1, 0], [0, 0]]))
    assert adv.shape == (2, 2) and adv.is_floating_point()


# ---- exact small cases that killed surviving mutants (TESTING.md) ------------------------------


def test_two_samples_per_group_are_enough_for_every_group_estimator():
    pair = torch.tensor([[1.0, 0.0]])
    torch.testing.assert_close(dr_grpo(pair), torch.tensor([[0.5, -0.5]]))
    torch.testing.assert_close(rloo(pair), torch.tensor([[1.0, -1.0]]))  # 2/1 * (r - mean)
    # one group: centered (0.5, -0.5), batch mean 0, biased std 0.5 -> (1, -1) up to eps
    torch.testing.assert_close(reinforce_pp(pair, eps=0.0), torch.tensor([[1.0, -1.0]]))


def test_reinforce_pp_eps_is_added_to_the_batch_std():
    # rewards ((1, 0), (0, 0)): centered ((0.5, -0.5), (0, 0)), batch mean 0,
    # biased std sqrt((0.25 + 0.25) / 4) = sqrt(0.125); eps = 0.25 is added, not subtracted
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    s = math.sqrt(0.125)
    expected = torch.tensor([[0.5 / (s + 0.25), -0.5 / (s + 0.25)], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(reinforce_pp(r, eps=0.25), expected)
    # the default eps is 1e-8: invisible next to std = 0.354
    torch.testing.assert_close(reinforce_pp(r), reinforce_pp(r, eps=0.0), rtol=1e-7, atol=0.0)
    torch.testing.assert_close(reinforce_pp(r)[0, 0], torch.tensor(0.5 / s, dtype=torch.float64))


def test_reinforce_pp_without_baseline_on_three_samples_per_prompt():
    # no group baseline, N = 3: batch mean 1/3 over (1, 0, 0), biased std sqrt(2/9)
    r = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    m, s = 1 / 3, math.sqrt(2 / 9)
    expected = torch.tensor([[(1 - m) / s, -m / s, -m / s]], dtype=torch.float64)
    torch.testing.assert_close(reinforce_pp(r, group_baseline=False, eps=0.0), expected)
