"""The `rollout_correction` feature wired into the update: its settings reach
`temper.algorithms.mismatch`, a correction changes the policy gradient exactly as the pure
weights say, micro-batching still never changes a gradient, the diagnostics leave an
uncorrected update as it was, and the recipe refuses a correction with top_p < 1."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from temper.algorithms.mismatch import Correction, correction_weights, mismatch_stats
from temper.algorithms.policy import masked_sum, policy_loss
from temper.train.features import BatchExtras
from temper.train.features.rollout_correction import RolloutCorrection
from temper.train.rl_config import RLConfig, rl_rules
from temper.train.rl_update import forward_rows, loss_terms, prepare
from test_rl_update import _config, _gradient, _off_policy, _rollouts, _setup


def _prepared(tokenizer, correction: Correction | None, config=None, seed=0):
    config = config or _config(advantage="grpo", kl_coef=0.0, entropy_coef=0.0)
    module, _ = _setup(tokenizer, config, seed=seed)
    batch = _off_policy(module, _rollouts(vocab=len(tokenizer)), noise=0.3)
    return (
        module,
        batch,
        config,
        prepare(batch, module, None, config, extras=BatchExtras(correction=correction)),
    )


def _trainer_logp(module, batch):
    from temper.train.rl_update import Prepared

    with torch.no_grad():
        p = Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, *[None] * 6)
        return forward_rows(module, p)[0].logp


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_the_blocks_settings_reach_the_pure_weights(tokenizer, mode):
    block = RolloutCorrection(mode=mode, cap=1.3, floor=0.8, threshold=0.2)
    module, batch, _, p = _prepared(tokenizer, block.correction())
    trainer = _trainer_logp(module, batch)
    want = correction_weights(trainer, batch.old_logprobs_R_T, batch.mask_R_T, mode, 1.3, 0.8)
    torch.testing.assert_close(p.is_weights, want, rtol=0, atol=0)
    torch.testing.assert_close(
        p.old_logp, trainer, rtol=0, atol=0
    )  # decoupled: the ratio against the trainer
    stats = mismatch_stats(trainer, batch.old_logprobs_R_T, batch.mask_R_T, 0.2)
    assert p.mismatch["mismatch/share_past"] == stats["share_past"]
    assert p.mismatch["mismatch/kl_k3"] == stats["kl_k3"] > 0
    # the bounds matter on these tensors: the default cap and floor give other weights
    other = correction_weights(trainer, batch.old_logprobs_R_T, batch.mask_R_T, mode, 2.0, None)
    assert not torch.equal(other, want)


def test_diagnostics_alone_change_nothing_the_update_reads(tokenizer):
    _, batch, _, plain = _prepared(tokenizer, None)
    _, _, _, diagnosed = _prepared(tokenizer, Correction())
    assert diagnosed.is_weights is None and plain.is_weights is None
    assert torch.equal(diagnosed.old_logp, batch.old_logprobs_R_T)  # still the sampler's
    assert torch.equal(diagnosed.advantages, plain.advantages)
    assert plain.mismatch == {} and plain.deferred is None
    assert diagnosed.deferred == Correction()  # left to the update's first forward (one epoch, one minibatch)


@pytest.mark.parametrize("epochs, minibatches", [(1, 1), (2, 1), (1, 2)])
def test_the_diagnostics_are_the_same_from_the_updates_forward_or_a_pass_of_their_own(
    tokenizer, epochs, minibatches
):
    """One epoch of one minibatch reads the diagnostics off the update's first forward (no pass of
    their own in `prepare`); more epochs or minibatches need the pass. Either way the metrics are
    those of the trainer's logprobs at the sampling weights, to the bit."""
    from temper.train.rl_update import update

    config = _config(advantage="grpo", kl_coef=0.0, entropy_coef=0.0, epochs=epochs, minibatches=minibatches)
    module, batch, _, p = _prepared(tokenizer, Correction(threshold=0.2), config)
    want = {
        f"mismatch/{k}": v
        for k, v in mismatch_stats(
            _trainer_logp(module, batch), batch.old_logprobs_R_T, batch.mask_R_T, 0.2
        ).items()
    }
    assert (p.deferred is not None) == (epochs == minibatches == 1)
    assert p.mismatch == ({} if p.deferred is not None else want)
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    update(module, optimizer, p, config, step=0, lr=0.1)
    assert p.mismatch == want and want["mismatch/max_abs"] > 0.1
    assert len(calls) == epochs * minibatches  # no forward beyond the update's own


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_a_correction_weights_the_policy_gradient_exactly(tokenizer, mode):
    """The policy term's gradient equals the gradient of sum(policy_loss x w) / tokens computed
    by hand from the pure functions, and differs from the uncorrected one."""
    correction = Correction(mode, cap=1.2, floor=0.9)
    module, batch, config, p = _prepared(tokenizer, correction)
    assert 0 < float((p.is_weights != 1).logical_and(p.mask).double().mean()) < 1
    (term,) = [t for t in loss_terms(config, p) if t.name == "policy"]
    got, _ = _gradient(module, p, [term], config)

    module.zero_grad(set_to_none=True)
    logp = forward_rows(module, p)[0].logp
    per_token, _ = policy_loss(
        logp, p.old_logp, p.advantages, p.mask, clip_low=config.clip_low, clip_high=config.clip_high,
        dual_clip=config.dual_clip,
    )  # fmt: skip
    (masked_sum(per_token * p.is_weights, p.mask, "token") / p.mask.sum()).backward()
    want = torch.cat(
        [(q.grad if q.grad is not None else torch.zeros_like(q)).flatten() for q in module.parameters()]
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)

    unweighted, _ = _gradient(module, replace(p, is_weights=None), [term], config)
    assert (unweighted - got).abs().max() > 1e-4


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate"])
def test_micro_batches_sum_to_the_full_batch_gradient_with_a_correction(tokenizer, mode):
    module, _, config, p = _prepared(tokenizer, Correction(mode, cap=1.2, floor=0.9))
    terms = loss_terms(config, p)
    full, _ = _gradient(module, p, terms, config)
    for micro in (1, 2, 4):
        split, _ = _gradient(module, p, terms, replace(config, micro_batch_size=micro))
        torch.testing.assert_close(split, full, rtol=1e-10, atol=1e-12)


def test_prepares_micro_batches_give_the_same_trainer_logprobs(tokenizer):
    _, batch, config, p = _prepared(tokenizer, Correction("token_truncate"))
    module, _ = _setup(tokenizer, config)
    q = prepare(
        batch,
        module,
        None,
        replace(config, micro_batch_size=2),
        extras=BatchExtras(correction=Correction("token_truncate")),
    )
    torch.testing.assert_close(q.is_weights, p.is_weights, rtol=1e-10, atol=1e-12)


def test_the_recipe_refuses_a_correction_with_top_p_and_bad_bounds():
    on = RolloutCorrection(mode="token_truncate")
    errors = dict(rl_rules(RLConfig(top_p=0.9, rollout_correction=on)))
    assert "TRL #6789" in errors[("train", "top_p")]
    assert not rl_rules(RLConfig(top_p=0.9))  # the diagnostics alone are allowed
    assert not rl_rules(RLConfig(top_p=0.9, temperature=0.0, rollout_correction=on))  # greedy: no truncation
    errors = dict(
        rl_rules(RLConfig(rollout_correction=RolloutCorrection(mode="token_mask", cap=1.5, floor=2.0)))
    )
    assert ("train", "rollout_correction", "floor") in errors
    errors = dict(
        rl_rules(RLConfig(rollout_correction=RolloutCorrection(mode="token_mask", diagnostics=False)))
    )
    assert ("train", "rollout_correction", "diagnostics") in errors


def test_two_features_cannot_both_correct():
    with pytest.raises(ValueError, match="two features correct"):
        BatchExtras(correction=Correction()).merge(BatchExtras(correction=Correction()))
    assert (
        BatchExtras().merge(BatchExtras(correction=Correction("token_mask"))).correction.mode == "token_mask"
    )


def test_with_dropout_the_trainer_logprobs_are_taken_without_it_and_draw_no_rng(tokenizer):
    """The sampler ran without dropout: the logprobs compared with its own must too, and the pass
    must not move the RNG (it would change every later sample of a run with the diagnostics on)."""
    from temper.train.rl_update import policy_with_value
    from test_rl_update import _gpt2

    config = _config(advantage="grpo", kl_coef=0.0, entropy_coef=0.0, dropout=True)
    module = policy_with_value(_gpt2(tokenizer), config).double()
    batch = _off_policy(module.eval(), _rollouts(vocab=len(tokenizer)), noise=0.3)
    want = _trainer_logp(module.eval(), batch)
    state = torch.random.get_rng_state()
    p = prepare(
        batch, module, None, config, extras=BatchExtras(correction=Correction("token_truncate", cap=5.0))
    )
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.testing.assert_close(p.old_logp, want, rtol=0, atol=0)
    assert module.training  # dropout back on for the update
