"""Exact values for the defaults and edges of the policy and value losses that the mutation run
(TESTING.md) found untested. Every number is worked by hand in the comment beside it."""

import math

import torch

from temper.algorithms.policy import masked_mean, policy_loss
from temper.algorithms.value import value_loss


def test_policy_loss_clips_at_0_2_by_default():
    # rho = e^0.5 = 1.6487 > 1.2 with A = 1: l = -min(1.6487, 1.2) = -1.2, gradient zeroed (clipped)
    # rho = e^-0.5 = 0.6065 < 0.8 with A = -1: l = -min(-0.6065, -0.8) = 0.8, clipped
    logp = torch.tensor([[0.5, -0.5]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = policy_loss(logp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 0.8]]))
    assert stats["clip_frac"].item() == 1.0


def test_a_zero_advantage_is_never_counted_as_clipped():
    # A = 0: the loss is 0 whatever rho is, and no gradient is zeroed by the clip
    loss, stats = policy_loss(
        torch.tensor([[-1.0, 1.0]]), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
    )
    torch.testing.assert_close(loss, torch.zeros(1, 2))
    assert stats["clip_frac"].item() == 0.0


def test_value_loss_clips_at_0_2_by_default():
    # v = 1, v_old = 0, R = 0: unclipped (1 - 0)^2 = 1, clipped v_old + clip(1, -0.2, 0.2) = 0.2 -> 0.04;
    # 0.5 * max(1, 0.04) = 0.5.  v = 0.1 is inside the clip: 0.5 * 0.01 = 0.005
    loss, stats = value_loss(
        torch.tensor([[1.0, 0.1]]), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
    )
    torch.testing.assert_close(loss, torch.tensor([[0.5, 0.005]]))
    # v = 1, v_old = 0, R = 2: unclipped (1 - 2)^2 = 1, clipped (0.2 - 2)^2 = 3.24 is larger:
    # 0.5 * 3.24 = 1.62, the clip is what bounds this update
    loss, stats = value_loss(
        torch.tensor([[1.0]]), torch.zeros(1, 1), torch.tensor([[2.0]]), torch.ones(1, 1)
    )
    torch.testing.assert_close(loss, torch.tensor([[1.62]]))
    assert stats["clip_frac"].item() == 1.0


def test_masked_mean_of_one_valid_token_is_that_token():
    x = torch.tensor([[3.0, 100.0]])
    mask = torch.tensor([[True, False]])
    assert masked_mean(x, mask).item() == 3.0
    assert masked_mean(x, mask, "sample").item() == 3.0
    assert math.isclose(masked_mean(x, torch.ones(1, 2)).item(), 51.5)
