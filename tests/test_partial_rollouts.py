"""`async_rollouts.in_flight: continue` (partial rollouts, `temper.train.pipeline.InFlight`):
the worker takes newer weights between the rounds of a batch, so later turns of the episodes in
flight are sampled by them and say so (through the agent loop, whose rounds are the turns).

What each test would catch: a worker that never looks for newer weights (the later turn's
logprobs would be the old model's); samples not tagged, or tagged with the version the batch
started with (in the rollouts' rows too); an agent loop that drops the tag from the turn's
segment; a later job that reloads its own older weights over the newer ones it already holds;
rules that let continue run without a correction or with nothing in flight; a run whose rows do
not record the versions."""

from __future__ import annotations

import queue
import threading
from dataclasses import replace

import pytest
import torch

from fakes import FirstByteTask
from temper.envs.base import StepResult
from temper.models.presets import build_preset
from temper.rollout import HFSampler
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.train.features.async_rollouts import AsyncRollouts
from temper.train.features.rollout_correction import RolloutCorrection
from temper.train.pipeline import InFlight, Tagged, in_flight_metrics, serve_jobs, weights_of
from temper.train.rl import RLConfig, train_rl
from temper.train.rl_config import rl_rules
from temper.train.rollouts import _versions


def _teacher_logprobs(model, sample):
    with torch.no_grad():
        logits = model(torch.tensor([sample.prompt_ids + sample.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(sample.prompt_ids) - 1 : -1], dim=-1)
    return logp.gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)


def _drive(jobs, worker_model, tokenizer, sample_step, results_wanted, *mode):
    """`serve_jobs` in a thread on the queued `jobs` until `results_wanted` batches are back."""
    base = HFSampler(worker_model, tokenizer)
    results = queue.SimpleQueue()
    worker = threading.Thread(
        target=serve_jobs, args=(jobs, results, worker_model, base, base, sample_step, *mode)
    )
    worker.start()
    out = [results.get(timeout=60) for _ in range(results_wanted)]
    jobs.put(None)
    worker.join(timeout=60)
    return out


def test_a_turn_after_newer_weights_arrive_is_sampled_and_tagged_by_them(tokenizer):
    old, new = build_preset("nano", tokenizer, seed=0).eval(), build_preset("nano", tokenizer, seed=1).eval()
    worker_model = build_preset("nano", tokenizer, seed=2).eval()  # the worker's own copy
    jobs = queue.SimpleQueue()
    prompt = tokenizer("hello")["input_ids"]
    calls = []

    def sample_step(sampler, step, graded):
        first = sampler.sample([prompt], 2, max_new_tokens=6, temperature=1.0, seed=0)
        if step == 0:  # k = 2: the trainer hands over job 1 (version 0) and, after update 1, job 2
            jobs.put((1, 0, weights_of(old)))
            jobs.put((2, 1, weights_of(new)))
        second = sampler.sample([prompt], 2, max_new_tokens=6, temperature=1.0, seed=0)
        calls.append((step, first, second))
        return [], [], 1, []

    jobs.put((0, 0, weights_of(old)))
    drawn = _drive(jobs, worker_model, tokenizer, sample_step, 3, "continue")

    # job 1 starts with the newer weights the worker already holds, not its own older ones
    assert [(status, step, d.version) for status, step, d in drawn] == [
        ("ok", 0, 0),
        ("ok", 1, 1),
        ("ok", 2, 1),
    ]
    (_, first, second), (_, later_first, _), _ = calls
    assert {s.policy_version for row in first for s in row} == {0}
    assert {s.policy_version for row in second for s in row} == {1}
    assert {s.policy_version for row in later_first for s in row} == {1}  # job 1 kept the new weights
    for s in first[0]:
        assert torch.allclose(torch.tensor(s.logprobs), _teacher_logprobs(old, s), atol=1e-5)
    for s in second[0]:
        assert torch.allclose(torch.tensor(s.logprobs), _teacher_logprobs(new, s), atol=1e-5)
        assert not torch.allclose(torch.tensor(s.logprobs), _teacher_logprobs(old, s), atol=1e-2)


class _HandsOverEnv:
    """Two chat turns; its step (between the agent loop's rounds) plays the trainer handing the
    worker a later job with newer weights, so the swap point is fixed, not timed."""

    stop = ()

    def __init__(self, hand_over):
        self.hand_over, self.k = hand_over, 0

    def reset(self):
        return [{"role": "user", "content": "walk"}]

    def step(self, action):
        self.k += 1
        if self.k == 1:
            self.hand_over()
            return StepResult(messages=[{"role": "user", "content": "again"}])
        return StepResult(done=True, reward=1.0)


class _Ended:
    """The sampler with every turn marked finished by its token (a tiny random model rarely samples
    eos, and the agent loop ends an episode at a truncated turn); turns of one token, which the
    chat template renders back as sampled. Tokens and logprobs are the model's."""

    def __init__(self, sampler):
        self.sampler = sampler

    def sample(self, *args, **kwargs):
        return [[replace(s, stop_reason="eos") for s in row] for row in self.sampler.sample(*args, **kwargs)]


def test_the_agent_loop_samples_the_turn_after_a_hand_over_with_the_newer_weights(tokenizer):
    old, new = build_preset("nano", tokenizer, seed=0).eval(), build_preset("nano", tokenizer, seed=1).eval()
    worker_model = build_preset("nano", tokenizer, seed=2).eval()
    base = HFSampler(worker_model, tokenizer)
    jobs = queue.SimpleQueue()
    ahead = InFlight(jobs, worker_model, base)
    assert ahead.start(0, weights_of(old)) == 0
    env = _HandsOverEnv(lambda: jobs.put((1, 1, weights_of(new))))
    [[traj]] = run_episodes(
        Tagged(_Ended(base), ahead), tokenizer, [[env]], [0], EpisodeLimits(max_tokens=200, max_new_tokens=1)
    )

    turns = [i for i, s in enumerate(traj.segments) if s.trainable]
    assert traj.policy_versions == [0, 1]
    assert [j[:2] for j in ahead.ahead] == [(1, 1)]  # the later job stays queued, to be sampled next
    first, second = (torch.tensor(traj.segments[i].logprobs) for i in turns)
    assert torch.allclose(first, _turn_logprobs(old, traj, turns[0]), atol=1e-5)
    assert torch.allclose(second, _turn_logprobs(new, traj, turns[1]), atol=1e-5)
    assert not torch.allclose(second, _turn_logprobs(old, traj, turns[1]), atol=1e-2)


def _turn_logprobs(model, traj, i):
    """The teacher-forced logprobs of segment i's tokens after every segment before it."""
    context, tokens = [t for s in traj.segments[:i] for t in s.token_ids], traj.segments[i].token_ids
    with torch.no_grad():
        logits = model(torch.tensor([context + tokens])).logits[0].float()
    logp = torch.log_softmax(logits[len(context) - 1 : -1], dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_finish_keeps_each_batch_on_its_own_weights(tokenizer):
    old, new = build_preset("nano", tokenizer, seed=0).eval(), build_preset("nano", tokenizer, seed=1).eval()
    worker_model = build_preset("nano", tokenizer, seed=2).eval()
    jobs = queue.SimpleQueue()
    prompt = tokenizer("hello")["input_ids"]
    seen = []

    def sample_step(sampler, step, graded):
        first = sampler.sample([prompt], 1, max_new_tokens=6, temperature=1.0, seed=0)
        if step == 0:
            jobs.put((1, 1, weights_of(new)))
        second = sampler.sample([prompt], 1, max_new_tokens=6, temperature=1.0, seed=0)
        seen.append((first[0][0], second[0][0]))
        return [], [], 1, []

    jobs.put((0, 0, weights_of(old)))
    _drive(jobs, worker_model, tokenizer, sample_step, 2)
    a, b = seen[0]
    assert a.policy_version is None and a.token_ids == b.token_ids  # same weights, same seed
    assert torch.allclose(torch.tensor(b.logprobs), _teacher_logprobs(old, b), atol=1e-5)


def test_continue_needs_staleness_and_a_correction():
    config = RLConfig(async_rollouts=AsyncRollouts(max_staleness=0, in_flight="continue"))
    assert "nothing is in flight" in dict(rl_rules(config))[("train", "async_rollouts", "in_flight")]
    config = replace(config, async_rollouts=AsyncRollouts(max_staleness=1, in_flight="continue"))
    assert "without a correction" in dict(rl_rules(config))[("train", "async_rollouts", "in_flight")]
    assert not rl_rules(replace(config, rollout_correction=RolloutCorrection(mode="token_mask")))


def test_in_flight_metrics_count_swapped_episodes_and_token_staleness():
    from types import SimpleNamespace

    from temper.rollout.trajectory import Segment, Trajectory

    swapped = Trajectory([Segment([1], None, False), Segment([2, 3], [0.0, 0.0], True, 0, policy_version=3),
                          Segment([9], None, False), Segment([4], [0.0], True, 1, policy_version=4)])  # fmt: skip
    kept = Trajectory([Segment([1], None, False), Segment([5, 6, 7], [0.0] * 3, True, 0, policy_version=4)])
    groups = [
        SimpleNamespace(rollouts=[SimpleNamespace(trajectory=swapped), SimpleNamespace(trajectory=kept)])
    ]
    got = in_flight_metrics(5, groups)
    assert got["async/swapped_share"] == 0.5
    assert got["async/token_staleness"] == (2 * 2 + 1 * 1 + 3 * 1) / 6
    # the rows: the version that sampled the first turn (over the job's), each turn's where they differ
    assert _versions(swapped) == {"policy_version": 3, "policy_versions": [3, 4]}
    assert _versions(kept) == {"policy_version": 4}
    assert _versions(Trajectory([Segment([1], None, False), Segment([5], [0.0], True, 0)])) == {}


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_run_with_episodes_continuing_under_newer_weights_trains_and_logs(tokenizer, tmp_path, worker):
    import json

    torch.manual_seed(0)
    model = build_preset("nano", tokenizer)
    config = RLConfig(
        steps=3, prompts_per_step=2, group_size=4, max_new_tokens=4, temperature=1.0, lr=3e-3, seed=1,
        progress=False, rollout_correction=RolloutCorrection(mode="token_mask"),
        async_rollouts=AsyncRollouts(max_staleness=1, worker=worker, in_flight="continue"),
    )  # fmt: skip
    result = train_rl(model, tokenizer, [FirstByteTask()], config, tmp_path)
    assert len(result.history) == 3
    assert all(0 <= r["async/swapped_share"] <= 1 and r["async/token_staleness"] >= 0 for r in result.history)
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    # step s (1-based) is scheduled with version max(0, s - 2) and may take at most s - 1, the
    # newest the trainer has handed over by then
    assert rows and all(max(0, r["step"] - 2) <= r["policy_version"] <= r["step"] - 1 for r in rows)
