"""Bounded-staleness rollouts (`async_rollouts`, temper.train.pipeline): the fixed schedule (the
batch of step s sampled with the weights after update max(0, s - k)) in both workers, the
reproducibility it buys (two runs equal; a run stopped after a checkpoint and resumed equals the
uninterrupted one), nothing dropped or reordered (with frozen weights an async run trains on
exactly the sync run's batches), a worker's failure raised as one error, and the rules.

`max_staleness: 0` is the lockstep loop unchanged: tests/test_pinned_recipes.py holds it to the
metrics recorded before the pipeline existed.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from fakes import FirstByteTask
from temper.models.presets import build_preset
from temper.train.features.async_rollouts import AsyncRollouts
from temper.train.pipeline import Pipelined, WorkerError, version_of
from temper.train.rl import RLConfig, train_rl
from temper.train.rl_config import rl_rules, rl_task_rules

TIMING = ("time/", "async/wait", "rollout_tokens_per_s", "train_tokens_per_s")


class Stop(Exception):
    pass


def _config(k: int, worker: str = "process", **kw) -> RLConfig:
    base = dict(
        steps=4, prompts_per_step=2, group_size=4, max_new_tokens=4, temperature=1.0, lr=3e-3,
        seed=1, progress=False, async_rollouts=AsyncRollouts(max_staleness=k, worker=worker),
    )  # fmt: skip
    return RLConfig(**(base | kw))


def _run(tokenizer, out, config, seed=0, callbacks=()):
    torch.manual_seed(seed)
    model = build_preset("nano", tokenizer)
    torch.manual_seed(config.seed)
    result = train_rl(model, tokenizer, [FirstByteTask()], config, out, callbacks=list(callbacks))
    return model, result


def _untimed(history):
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in history]


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _versions(out):
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return sorted({(r["step"], r["policy_version"]) for r in rows})


# ---- the schedule, at the worker ------------------------------------------------------------------


class _Marked(torch.nn.Module):
    """A model whose one weight says which version it is."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))


class _Reads:
    """A sampler over a model: the worker syncs it before each job."""

    def sync(self, model):
        self.model = model


def _seen_version(sampler, step, graded):
    return [(step, int(sampler.model.w.item()))], [None], 1, []


@pytest.mark.parametrize("worker", ["process", "thread"])
@pytest.mark.parametrize("k", [1, 2])
def test_the_batch_of_step_s_is_sampled_with_the_weights_after_update_s_minus_k(worker, k):
    model, steps = _Marked(), 7
    pipe = Pipelined(k, _seen_version, model, _Reads(), last=steps - 1, worker=worker)
    try:
        seen = []
        for step in range(steps):
            drawn = pipe.take(step, model)
            seen += drawn.local
            assert drawn.version == version_of(step, k)
            with torch.no_grad():
                model.w += 1  # the update: version step + 1
    finally:
        pipe.close()
    assert seen == [(s, max(0, s - k)) for s in range(steps)]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_resumed_pipeline_samples_its_first_k_steps_with_the_kept_versions(worker):
    model, k = _Marked(), 2
    pipe = Pipelined(k, _seen_version, model, _Reads(), last=9, worker=worker)
    try:
        for step in range(4):
            pipe.take(step, model)
            with torch.no_grad():
                model.w += 1
        kept = pipe.versions()  # what a checkpoint after step 4 saves
    finally:
        pipe.close()
    assert sorted(kept) == [2, 3]
    fresh = _Marked()
    with torch.no_grad():
        fresh.w += 4  # the checkpoint's weights: version 4
    resumed = Pipelined(k, _seen_version, fresh, _Reads(), start=4, last=9, versions=kept, worker=worker)
    try:
        assert [resumed.take(s, fresh).local[0] for s in (4,)] == [(4, 2)]
        with torch.no_grad():
            fresh.w += 1
        assert resumed.take(5, fresh).local[0] == (5, 3)
    finally:
        resumed.close()
    lost = Pipelined(k, _seen_version, fresh, _Reads(), start=4, last=9, versions={}, worker=worker)
    try:
        with pytest.raises(WorkerError, match="version 2, which were not kept"):
            lost.take(4, fresh)
    finally:
        lost.close()


def _fails(sampler, step, graded):
    if step == 1:
        raise KeyError("no such problem")
    return [], [], 1, []


def _dies(sampler, step, graded):
    import os

    os._exit(3)


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_failing_worker_raises_one_error_naming_the_step(worker):
    model = _Marked()
    pipe = Pipelined(1, _fails, model, _Reads(), last=3, worker=worker)
    try:
        pipe.take(0, model)
        with pytest.raises(WorkerError, match=r"failed on step 2: KeyError: 'no such problem'"):
            pipe.take(1, model)
    finally:
        pipe.close()


def test_a_worker_process_that_dies_is_an_error_not_a_hang():
    model = _Marked()
    pipe = Pipelined(1, _dies, model, _Reads(), last=3, worker="process")
    try:
        with pytest.raises(WorkerError, match=r"died \(exit code 3\) before step 1"):
            pipe.take(0, model)
    finally:
        pipe.close()


# ---- whole runs -----------------------------------------------------------------------------------


def test_an_async_run_is_reproducible_and_logs_its_staleness(tokenizer, tmp_path):
    a, ra = _run(tokenizer, tmp_path / "a", _config(1))
    b, rb = _run(tokenizer, tmp_path / "b", _config(1))
    assert _untimed(ra.history) == _untimed(rb.history)
    assert _same_weights(a, b)
    assert [r["async/staleness"] for r in ra.history] == [0, 1, 1, 1]
    assert _versions(tmp_path / "a") == [(1, 0), (2, 0), (3, 1), (4, 2)]
    # the stale samples are off-policy: the ratio against them is no longer 1 on the first epoch
    assert ra.history[0]["mismatch/max_abs"] < 1e-4 < ra.history[2]["mismatch/max_abs"]
    sync, rs = _run(tokenizer, tmp_path / "sync", _config(0))
    assert "async/staleness" not in rs.history[0]
    assert _untimed(rs.history)[:2] != _untimed(ra.history)[:2]  # step 2 sampled with other weights


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_with_frozen_weights_an_async_run_trains_on_exactly_the_sync_runs_batches(
    tokenizer, tmp_path, worker
):
    """lr so small that no weight moves: every version is the same model, so whatever the
    staleness each step must see the sync run's samples: none dropped, reordered or re-seeded."""
    frozen = dict(lr=1e-30, steps=3)
    _, sync = _run(tokenizer, tmp_path / "sync", _config(0, **frozen))
    _, lagged = _run(tokenizer, tmp_path / "k2", _config(2, worker, **frozen))
    sampled = ("reward", "accuracy", "response_length")
    assert [[r[k] for k in sampled] for r in sync.history] == [
        [r[k] for k in sampled] for r in lagged.history
    ]
    # the forked worker samples at 1 torch thread, the sync run at the suite's: the behaviour
    # logprobs (and so the loss, about 0 here) agree to rounding, not bit for bit, on some CPUs
    for a, b in zip(sync.history, lagged.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)


def test_a_resumed_async_run_equals_the_uninterrupted_one(tokenizer, tmp_path):
    config = _config(2, save_every=2, steps=5)
    full, rf = _run(tokenizer, tmp_path / "full", config)

    def stop_after_3(step, row):
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        _run(tokenizer, tmp_path / "cut", config, callbacks=[stop_after_3])  # checkpoint at step 2
    resumed, rr = _run(tokenizer, tmp_path / "cut", config, seed=99)  # the weights come from the checkpoint
    assert _untimed(rr.history) == _untimed(rf.history)
    assert _same_weights(resumed, full)


def test_a_checkpoint_without_the_kept_versions_cannot_resume_silently(tokenizer, tmp_path):
    config = _config(2, save_every=2, steps=4)

    def stop_after_3(step, row):
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        _run(tokenizer, tmp_path / "cut", config, callbacks=[stop_after_3])
    (kept,) = (tmp_path / "cut" / "checkpoints").glob("step-*/pipeline.pt")
    kept.unlink()
    with pytest.raises(WorkerError, match="were not kept"):
        _run(tokenizer, tmp_path / "cut", config)


# ---- rules -----------------------------------------------------------------------------------------


def test_the_rules_refuse_what_a_worker_ahead_of_training_would_get_wrong():
    from temper.rewards.judge import JudgeSpec

    judged = dict(judge=JudgeSpec(model="policy"), rewards={"outcome": 1.0, "judge": 1.0})
    errors = dict(rl_rules(replace(_config(1), **judged)))
    assert "judge that is the policy" in errors[("train", "async_rollouts", "max_staleness")]
    assert not rl_rules(replace(_config(0), **judged))

    from temper.train.features.rollout_correction import RolloutCorrection

    for mode in ("sequence_mask", "sequence_truncate"):
        errors = dict(rl_rules(replace(_config(2), rollout_correction=RolloutCorrection(mode=mode))))
        assert "long episodes" in errors[("train", "rollout_correction", "mode")]
        assert not rl_rules(replace(_config(0), rollout_correction=RolloutCorrection(mode=mode)))
    assert not rl_rules(replace(_config(2), rollout_correction=RolloutCorrection(mode="token_mask")))

    class Growing(FirstByteTask):
        failure_curriculum = object()

    errors = dict(rl_task_rules(_config(1), {"repair": Growing()}))
    assert "grows its curriculum" in errors[("train", "async_rollouts", "max_staleness")]
    assert not rl_task_rules(_config(0), {"repair": Growing()})


def test_a_pipelined_run_over_an_engine_sampler_needs_a_thread_worker(tokenizer, tmp_path):
    """A sampler without an in-process model (a vLLM engine's place) cannot be forked with the
    process worker; the thread worker drives it (tests/test_vllm_server*.py run it)."""
    from fakes import PatternSampler

    model = build_preset("nano", tokenizer)
    with pytest.raises(ValueError, match="PatternSampler needs worker: thread"):
        train_rl(model, tokenizer, [FirstByteTask()], _config(1), tmp_path, sampler=PatternSampler([True]))


# ---- the off-policy correction of stale batches: AReaL's decoupled objective ----------------------


def _areal_decoupled_loss(
    logprobs, old_logprobs, advantages, eps_clip, loss_mask, c_clip, proximal_logprobs, cap
):
    """AReaL's decoupled PPO loss, transcribed (realhf/impl/model/utils/ppo_functional.py,
    actor_loss_fn): the ratio against the proximal policy, clipped; the behaviour weight
    pi_prox / pi_behav, tokens above the cap dropped; a token mean."""
    loss_mask_count = loss_mask.count_nonzero() or 1
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    pg_loss3 = torch.sign(advantages) * c_clip * advantages
    pg_loss = torch.min(pg_loss, pg_loss3)
    behav_kl = proximal_logprobs - old_logprobs
    behav_imp_weight = behav_kl.exp()
    behav_mask = (behav_imp_weight <= cap).logical_and(loss_mask)
    behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
    pg_loss = pg_loss * behav_imp_weight
    return torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count


def test_a_token_mask_correction_of_a_stale_batch_is_areals_decoupled_loss():
    """`rollout_correction: {mode: token_mask, cap: C}` on a stale batch: the PPO ratio against the
    trainer at the start of the update (AReaL's proximal policy), the behaviour weight masked
    above C; equal to AReaL's loss and gradient on the same tensors, with the cap active."""
    from temper.algorithms.mismatch import Correction
    from temper.algorithms.policy import masked_mean, policy_loss

    g = torch.Generator().manual_seed(0)
    behaviour = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3  # the stale sampler's logprobs
    proximal = behaviour + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.8
    current = (proximal + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    advantages = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = mask[3, 2:] = False
    cap, eps, c = 1.5, 0.2, 3.0

    weights, _ = Correction("token_mask", cap=cap)(proximal, behaviour, mask)
    assert 0 < int(((weights == 0) & mask).sum()) < int(mask.sum())  # the cap drops some tokens, not all
    per_token, _ = policy_loss(current, proximal, advantages, mask, clip_low=eps, clip_high=eps, dual_clip=c)
    ours = masked_mean(per_token * weights, mask)
    (g_ours,) = torch.autograd.grad(ours, current)
    theirs = _areal_decoupled_loss(current, behaviour, advantages, eps, mask, c, proximal, cap)
    (g_theirs,) = torch.autograd.grad(theirs, current)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-14)
