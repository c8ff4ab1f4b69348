import math

import pytest
import torch

from temper.algorithms.policy import masked_mean
from temper.algorithms.value import gae, value_loss

F64 = torch.float64


def reference_gae(rewards_B_T, values_B_T, mask_B_T, gamma, lam):
    """Textbook GAE, one sequence at a time over its valid tokens only (cf. cleanrl's loop version)."""
    advantages = torch.zeros_like(values_B_T)
    for b in range(values_B_T.shape[0]):
        idx = mask_B_T[b].nonzero().flatten().tolist()
        last = 0.0
        for k in reversed(range(len(idx))):
            next_value = values_B_T[b, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = rewards_B_T[b, idx[k]].item() + gamma * next_value - values_B_T[b, idx[k]].item()
            last = delta + gamma * lam * last
            advantages[b, idx[k]] = last
    return advantages, torch.where(mask_B_T, advantages + values_B_T, 0.0)


def test_gae_three_tokens_by_hand():
    # reward 1 on the last token; a padded 4th position holds junk that must be ignored
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.6, 0.7, 9.9]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)

    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.3, 0.0]], dtype=F64))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=F64))

    # gamma 0.9, lam 0.8 (gamma * lam = 0.72):
    # delta_2 = 1 - 0.7 = 0.3                 A_2 = 0.3
    # delta_1 = 0.9 * 0.7 - 0.6 = 0.03        A_1 = 0.03 + 0.72 * 0.3 = 0.246
    # delta_0 = 0.9 * 0.6 - 0.5 = 0.04        A_0 = 0.04 + 0.72 * 0.246 = 0.21712
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.21712, 0.246, 0.3, 0.0]], dtype=F64))
    torch.testing.assert_close(ret, torch.tensor([[0.71712, 0.846, 1.0, 0.0]], dtype=F64))


def _ragged(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=F64)
    values = torch.randn(B, T, generator=g, dtype=F64)
    lengths = torch.tensor([0, 1, T, 3, 5, 2])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]  # right padded
    return rewards, values, mask


def test_gamma_lam_one_gives_reward_to_go():
    rewards, values, mask = _ragged(0)
    adv, ret = gae(rewards, values, mask)
    to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(ret, to_go)
    torch.testing.assert_close(adv, (to_go - values) * mask)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_per_sequence_loop_on_ragged_masks(gamma, lam):
    rewards, values, mask = _ragged(1)
    torch.testing.assert_close(
        gae(rewards, values, mask, gamma, lam), reference_gae(rewards, values, mask, gamma, lam)
    )


def test_gae_skips_masked_tokens_inside_a_sequence():
    # e.g. tool output between two assistant turns: positions 2-3 are not actions
    rewards, values, _ = _ragged(2, B=2, T=7)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [0, 1, 0, 1, 0, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(
        gae(rewards, values, mask, 0.9, 0.8), reference_gae(rewards, values, mask, 0.9, 0.8)
    )


def test_gae_has_no_gradient():
    values = torch.randn(2, 3, requires_grad=True)
    adv, ret = gae(torch.randn(2, 3), values, torch.ones(2, 3, dtype=torch.bool))
    assert not adv.requires_grad and not ret.requires_grad


def test_value_loss_clipped_by_hand():
    # per token, clip 0.2 around old value 1.0:
    #   v=1.5, R=2.0: unclipped 0.25, clipped (1.2 - 2)^2 = 0.64 -> 0.64 (clipped branch)
    #   v=1.1, R=2.0: inside the band, both 0.81 -> 0.81
    #   v=0.5, R=0.0: unclipped 0.25, clipped 0.8^2 = 0.64 -> 0.64 (clipped branch)
    #   v=1.5, R=1.5: unclipped 0, clipped 0.09 -> 0.09 (clipped branch)
    #   v=7.0, R=-3.0: masked out
    values = torch.tensor([[1.5, 1.1, 0.5], [1.5, 7.0, 7.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=F64)
    returns = torch.tensor([[2.0, 2.0, 0.0], [1.5, -3.0, -3.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    per_token, stats = value_loss(values, old, returns, mask, clip=0.2)
    loss = masked_mean(per_token, mask)
    assert math.isclose(loss.item(), 0.5 * (0.64 + 0.81 + 0.64 + 0.09) / 4, rel_tol=1e-12)
    assert stats["clip_frac"].item() == 3 / 4
    loss.backward()
    # only the unclipped token in the band gets a gradient: 0.5 * 2 (v - R) / 4
    torch.testing.assert_close(
        values.grad, torch.tensor([[0.0, 0.5 * 2 * (1.1 - 2.0) / 4, 0.0], [0.0] * 3], dtype=F64)
    )


def test_value_loss_without_clip_is_half_mse():
    values = torch.tensor([[1.5, 1.1, 0.5], [1.5, 7.0, 7.0]], dtype=F64)
    returns = torch.tensor([[2.0, 2.0, 0.0], [1.5, -3.0, -3.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    per_token, stats = value_loss(values, torch.zeros_like(values), returns, mask, clip=None)
    assert math.isclose(
        masked_mean(per_token, mask).item(), 0.5 * (0.25 + 0.81 + 0.25 + 0.0) / 4, rel_tol=1e-12
    )
    assert stats["clip_frac"].item() == 0.0


# ---- exact cases, folded in from test_policy_exact.py ------------------------------------------
# Exact values for the defaults and edges of the policy and value losses that the mutation run
# (TESTING.md) found untested. Every number is worked by hand in the comment beside it.


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
