"""Exact GAE estimator cases by hand: the KL penalty enters the token rewards only with a
reference and a positive coefficient. Written against the mutants mutmut left alive (TESTING.md)."""

import torch

from temper.algorithms.estimators import AdvantageInputs, gae_estimator


def inputs(**kw):
    base = dict(
        rewards_G_N=torch.tensor([[1.0]]),
        mask_R_T=torch.tensor([[True, True]]),
        values_R_T=torch.zeros(1, 2),
        gamma=1.0,
        lam=1.0,
        whiten=False,
    )
    return AdvantageInputs(**(base | kw))


def test_gae_with_a_reference_but_no_coefficient_ignores_the_kl():
    # token rewards [0, 1]; with V = 0 and gamma = lam = 1 both advantages are the return 1
    adv, ret = gae_estimator(inputs(ref_kl_R_T=torch.tensor([[0.5, 0.5]]), kl_coef=0.0))
    assert adv.tolist() == [[1.0, 1.0]] and ret.tolist() == [[1.0, 1.0]]


def test_gae_with_a_kl_coefficient_charges_every_token():
    # token rewards [-0.1 * 0.5, 1 - 0.1 * 0.5] = [-0.05, 0.95]: returns [0.9, 0.95]
    adv, ret = gae_estimator(inputs(ref_kl_R_T=torch.tensor([[0.5, 0.5]]), kl_coef=0.1))
    assert torch.allclose(adv, torch.tensor([[0.9, 0.95]])) and torch.allclose(ret, adv)
