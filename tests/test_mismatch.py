"""The mismatch diagnostics and importance weights (`temper.algorithms.mismatch`) equal TRL's and
verl's on identical tensors. Neither exposes a callable (TRL computes the weights inline in
`GRPOTrainer._generate_and_score_completions`; verl's helper imports verl's DataProto), so their
formulas are re-implemented below line for line, each citing the file and lines it copies:
TRL 1.16.0 as installed (trl/trainer/grpo_trainer.py) and verl at b178a3c
(verl/trainer/ppo/rollout_corr_helper.py)."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms.mismatch import Correction, correction_weights, mismatch_stats


def _tensors(seed: int = 0, scale: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    R, T = 6, 9
    sampler = -torch.rand(R, T, generator=g, dtype=torch.float64) * 3
    trainer = sampler + torch.randn(R, T, generator=g, dtype=torch.float64) * scale
    lengths = torch.tensor([9, 1, 5, 7, 3, 8])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return trainer, sampler, mask


def _trl_is_ratio(old, sampling, mask, mode, clip_max, clip_min):
    # trl/trainer/grpo_trainer.py:2660-2706 (TRL 1.16.0)
    per_token_logps_diff = (old - sampling) * mask
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    # the loss multiplies per_token_loss by it, then by the completion mask (grpo_trainer.py:3147, 3154-3159)
    return ratio.expand_as(mask) * mask


def _verl_is_weights(old, rollout, mask, level, threshold):
    # verl/trainer/ppo/rollout_corr_helper.py:530-562 (compute_rollout_correction_weights)
    log_ratio = old - rollout
    if level == "token":
        weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = (log_ratio * mask).sum(-1, keepdim=True)  # verl_F.masked_sum(axis=-1)
        weights = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    weights = weights * mask
    return weights.clamp(max=threshold)


def _verl_seq_sum_k1_keep(old, rollout, mask, lower, upper):
    # rollout_corr_helper.py:221-222, 259-260, 288-289, 299 (seq_sum_k1), then 371
    token_k1 = -torch.clamp(old - rollout, min=-20.0, max=20.0)
    seq_stat = (token_k1 * mask).sum(-1)
    keep = (seq_stat >= math.log(lower)) & (seq_stat <= math.log(upper))
    return keep[:, None].expand_as(mask) & mask


def _verl_offpolicy(old, rollout, mask):
    # rollout_corr_helper.py:889 (kl) and 894-896 (k3_kl), masked_mean over every token
    kl = ((rollout - old) * mask).sum() / mask.sum()
    lr = old - rollout
    k3 = ((torch.exp(lr) - lr - 1) * mask).sum() / mask.sum()
    return float(kl), float(k3)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("bounds", [(2.0, None), (1.5, 0.5), (1.2, 0.9)])
def test_weights_equal_trls_vllm_importance_sampling(mode, bounds):
    trainer, sampler, mask = _tensors(scale=0.5 if mode.startswith("token") else 0.15)
    cap, floor = bounds
    ours = correction_weights(trainer, sampler, mask, mode, cap, floor)
    trl = _trl_is_ratio(trainer, sampler, mask, mode, cap, floor)
    torch.testing.assert_close(ours, trl, rtol=0, atol=0)
    # the case is not trivial: some tokens or sequences are cut or dropped, some kept as they are
    delta = (trainer - sampler) * mask
    ratio = torch.exp(delta.sum(-1, keepdim=True) if mode.startswith("sequence") else delta).expand_as(mask)
    assert ((ratio > cap) & mask).any()
    assert ((ours == ratio) & mask).any()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_truncate_modes_equal_verls_rollout_is(level):
    trainer, sampler, mask = _tensors(seed=1)
    ours = correction_weights(trainer, sampler, mask, f"{level}_truncate", 2.0)
    torch.testing.assert_close(ours, _verl_is_weights(trainer, sampler, mask, level, 2.0), rtol=0, atol=0)


def test_sequence_mask_keeps_what_verls_seq_sum_k1_rejection_keeps():
    """verl's decoupled_seq_is_rs preset: sequence TIS at 2.0 and seq_sum_k1 rejection "0.5_2.0";
    our sequence_mask with [0.5, 2.0] keeps exactly the sequences verl keeps."""
    trainer, sampler, mask = _tensors(seed=2, scale=0.3)
    ours = correction_weights(trainer, sampler, mask, "sequence_mask", 2.0, 0.5)
    keep = _verl_seq_sum_k1_keep(trainer, sampler, mask, 0.5, 2.0)
    assert torch.equal(ours > 0, keep)
    assert 0 < int(keep.any(-1).sum()) < int(mask.any(-1).sum())  # some sequences dropped, some kept


def test_stats_equal_verls_kl_and_trls_logp_difference():
    trainer, sampler, mask = _tensors(seed=3)
    s = mismatch_stats(trainer, sampler, mask, threshold=0.5)
    kl, k3 = _verl_offpolicy(trainer, sampler, mask)
    assert s["kl_k1"] == pytest.approx(kl, rel=1e-12)
    assert s["kl_k3"] == pytest.approx(k3, rel=1e-12)
    # TRL grpo_trainer.py:2861-2866: sampling_logp_difference/{mean,max} over the completion tokens
    delta = torch.abs(trainer - sampler)[mask]
    assert s["mean_abs"] == pytest.approx(float(delta.mean()), rel=1e-12)
    assert s["max_abs"] == float(delta.max())
    assert s["mean"] == pytest.approx(float((trainer - sampler)[mask].mean()), rel=1e-12)
    assert s["share_past"] == pytest.approx(float((delta > 0.5).double().mean()))
    assert s["tokens"] == int(mask.sum())
    seq = ((trainer - sampler) * mask).sum(-1)
    assert s["seq_max_abs"] == pytest.approx(float(seq.abs().max()), rel=1e-12)


def test_padding_never_counts():
    """A token outside the mask with a huge log-ratio changes neither the stats nor the weights."""
    trainer, sampler, mask = _tensors(seed=4)
    spoiled = trainer.masked_fill(~mask, 50.0)
    assert mismatch_stats(trainer, sampler, mask, 0.5) == mismatch_stats(spoiled, sampler, mask, 0.5)
    for mode in ("token_truncate", "sequence_mask"):
        a = correction_weights(trainer, sampler, mask, mode, 2.0)
        assert torch.equal(a, correction_weights(spoiled, sampler, mask, mode, 2.0))
        assert not a[~mask].any()


def test_weights_are_detached_and_safety_bounded():
    trainer, sampler, mask = _tensors(seed=5)
    trainer = (trainer + 40 * mask).requires_grad_()  # log-ratio ~40 per token: exp would be ~2e17
    w = correction_weights(trainer, sampler, mask, "sequence_truncate", 1e30)
    assert not w.requires_grad
    assert float(w.max()) == pytest.approx(math.exp(20.0))


def test_off_gives_stats_only_and_bad_modes_are_refused():
    trainer, sampler, mask = _tensors()
    w, stats = Correction()(trainer, sampler, mask)
    assert w is None and set(stats) >= {"mismatch/mean", "mismatch/kl_k3", "mismatch/share_past"}
    w, stats = Correction("token_mask", cap=1.5, floor=0.7)(trainer, sampler, mask)
    assert stats["mismatch/dropped"] == pytest.approx(float(((w == 0) & mask).sum() / mask.sum()))
    with pytest.raises(ValueError, match="unknown correction mode"):
        correction_weights(trainer, sampler, mask, "token_clip", 2.0)


def test_sequence_mask_equals_verls_decoupled_seq_is_rs_preset():
    """verl's decoupled_seq_is_rs(is_threshold=2.0, rs_threshold="0.5_2.0") weights a kept
    sequence by min(R, 2) and rejects the rest (verl/trainer/config/algorithm.py:210-232); within
    [0.5, 2] min(R, 2) = R, so its weight x keep is our sequence_mask with floor 0.5, cap 2.
    (verl drops a rejected token from the loss's mask; temper, as TRL, gives it weight 0.)"""
    trainer, sampler, mask = _tensors(seed=6, scale=0.2)
    verl = _verl_is_weights(trainer, sampler, mask, "sequence", 2.0) * _verl_seq_sum_k1_keep(
        trainer, sampler, mask, 0.5, 2.0
    )
    ours = correction_weights(trainer, sampler, mask, "sequence_mask", 2.0, 0.5)
    torch.testing.assert_close(ours, verl, rtol=1e-12, atol=0)
    assert (ours == 0).logical_and(mask).any() and (ours > 0).any()
