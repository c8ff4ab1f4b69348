"""The RL loop at the level users see it: the reward rises on a learnable task; dynamic sampling,
the probe's causes, the format gate and resume behave as documented."""

import json
from dataclasses import dataclass

import pytest
import torch

from temper.models import build_preset
from temper.rewards.diagnostics import breakdown, zero_variance_cause
from temper.rollout import HFSampler
from temper.tasks.base import Problem, Score
from temper.train.features import Features
from temper.train.features.dynamic_sampling import Refill
from temper.train.rl import RLConfig, collect_groups, train_rl


@dataclass
class FirstByteTask:
    """Reward 1 when the completion's first character is ASCII below 'P' (about a third of the
    byte vocabulary for a random model): learnable in a few steps, with variance in every group."""

    name: str = "first_byte"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{seed}-{i}", f"q{(seed + i) % 7}") for i in range(n)]

    def score(self, problem, completion):
        ok = bool(completion) and completion[0] < "P"
        return Score(float(ok), ok, bool(completion), {"reason": "correct" if ok else "wrong"})

    def demonstration(self, problem):
        return "A"

    def corpus_text(self, problem):
        return problem.prompt


def _config(**kw):
    base = dict(steps=12, prompts_per_step=4, group_size=8, max_new_tokens=2, lr=3e-3, seed=0, progress=False)
    return RLConfig(**(base | kw))


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_reward_rises_on_a_learnable_task(tokenizer, tmp_path, advantage):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    result = train_rl(model, tokenizer, [FirstByteTask()], _config(advantage=advantage, lr=1e-2), tmp_path)
    rewards = [row["reward"] for row in result.history]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.25, rewards


def test_kl_to_reference_and_metrics_are_logged(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=1)
    reference = build_preset("nano", tokenizer, seed=1).requires_grad_(False)
    result = train_rl(
        model, tokenizer, [FirstByteTask()], _config(steps=3, kl_coef=0.1), tmp_path, reference=reference
    )
    first, last = result.history[0], result.history[-1]
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-5)  # identical weights before the first update
    assert last["kl_ref"] > 0
    for key in (
        "reward",
        "reward/outcome",
        "accuracy",
        "zero_variance",
        "entropy",
        "clip_frac",
        "response_length",
        "rollout_tokens_per_s",
        "train_tokens_per_s",
        "time/sample",
        "time/train",
        "kl",
    ):
        assert key in last, key
    assert (tmp_path / "rollouts.jsonl").read_text().count("\n") == 3 * 2 * 8


def test_dynamic_sampling_never_keeps_a_constant_reward_group(tokenizer):
    model = build_preset("nano", tokenizer, seed=1)
    sampler = HFSampler(model, tokenizer)
    config = _config(group_size=3, prompts_per_step=6)
    groups, stats = collect_groups(
        sampler, tokenizer, [FirstByteTask()], config, step=0, features=Features([Refill(6)])
    )
    assert stats["zero_variance"] > 0  # with 3 samples some groups are constant...
    assert groups and all(len(set(g.rewards)) > 1 for g in groups)  # ...and none of them is kept
    assert len(groups) <= 6 and stats["sampling_rounds"] >= 2


def _score(correct, parsed=True, reason=None):
    return Score(float(correct), correct, parsed, {"reason": reason or ("correct" if correct else "wrong")})


def test_probe_attributes_zero_variance_causes():
    assert zero_variance_cause([_score(True), _score(False)], [1.0, 0.0], [False, False]) is None
    assert zero_variance_cause([_score(True)] * 3, [1.0] * 3, [False] * 3) == "all_correct"
    assert zero_variance_cause([_score(False)] * 3, [0.0] * 3, [False] * 3) == "all_wrong"
    assert zero_variance_cause([_score(False, False)] * 3, [0.0] * 3, [False] * 3) == "parse_failure"
    assert zero_variance_cause([_score(False, False)] * 3, [0.0] * 3, [True] * 3) == "truncated"
    verifier = [_score(False), _score(False, reason="verifier_error")]
    assert zero_variance_cause(verifier, [0.0, 0.0], [False, False]) == "verifier_error"
    shares = breakdown([None, "all_wrong", "all_wrong", "parse_failure"])
    assert shares["zero_variance"] == 0.75
    assert shares["zero_variance/all_wrong"] == 0.5 and shares["zero_variance/parse_failure"] == 0.25
    assert shares["zero_variance/all_correct"] == 0.0


class _Clock:
    """time.perf_counter advancing 0.5 s per call; `now` is the last value it gave."""

    now = 0.0

    def perf_counter(self):
        self.now += 0.5
        return self.now


def test_resume_reproduces_the_uninterrupted_run(tokenizer, tmp_path, monkeypatch):
    import temper.train.rl as rl

    clock = _Clock()
    monkeypatch.setattr(rl, "time", clock)
    config = _config(steps=4, save_every=2)
    full = train_rl(
        build_preset("nano", tokenizer, seed=1), tokenizer, [FirstByteTask()], config, tmp_path / "a"
    )

    class Stop(Exception):
        pass

    def crash(step, row):
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        train_rl(
            build_preset("nano", tokenizer, seed=1),
            tokenizer,
            [FirstByteTask()],
            config,
            tmp_path / "b",
            callbacks=[crash],
        )
    began = clock.now
    resumed = train_rl(
        build_preset("nano", tokenizer, seed=5), tokenizer, [FirstByteTask()], config, tmp_path / "b"
    )
    # the summary covers the whole run: the rows and tokens before the resume too
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]
    assert (resumed.sampled_tokens, resumed.trained_tokens) == (full.sampled_tokens, full.trained_tokens)
    assert resumed.seconds > clock.now - began
    for a, b in zip(full.history[2:], resumed.history[2:]):
        # the on-policy loss is ~0 (advantages sum to zero per group): compare it absolutely, and the
        # update through its gradient norm and the policy's entropy
        assert a["reward"] == b["reward"] and a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-5)
    # rerun after the last checkpoint (a kill in the stage's final save): no step, the same summary
    began = clock.now
    again = train_rl(
        build_preset("nano", tokenizer, seed=5), tokenizer, [FirstByteTask()], config, tmp_path / "b"
    )
    assert again.history == resumed.history and again.seconds > clock.now - began
    assert (again.sampled_tokens, again.trained_tokens) == (full.sampled_tokens, full.trained_tokens)


def test_rollout_batch_masks_only_completion_tokens(tokenizer):
    from temper.rollout.sampler import Sample
    from temper.train.rollouts import Group, Rollout, one_step, to_batch

    def rollout(prompt, completion, logprobs, reward):
        score = Score(reward, reward == 1.0, True)
        sample = Sample(prompt, completion, logprobs, "", "eos")
        return Rollout(Problem("t", "train", "x", "q"), one_step(sample, score), score, reward, {})

    group = Group(
        [rollout([5, 6, 7], [8, 9], [-0.5, -0.25], 1.0), rollout([5], [1, 2, 3], [-1.0, -2.0, -3.0], 0.0)],
        None,
        [1.0, 0.0],
    )
    batch = to_batch([group])
    assert batch.prompts == [[5, 6, 7], [5]]
    assert batch.completions_R_T.tolist() == [[8, 9, 0], [1, 2, 3]]
    assert batch.mask_R_T.tolist() == [[True, True, False], [True, True, True]]
    assert batch.old_logprobs_R_T.tolist() == [[-0.5, -0.25, 0], [-1.0, -2.0, -3.0]]
    assert batch.rewards_G_N.tolist() == [[1.0, 0.0]]


def test_format_gate_stops_a_policy_that_cannot_answer(tokenizer):
    from temper.catalog import make_task
    from temper.stages.rl import GateError, GateSpec, format_gate

    model = build_preset("nano", tokenizer, seed=1)  # untrained: never writes "Answer: ..."
    sampler = HFSampler(model, tokenizer)
    tasks = {"arithmetic": make_task("arithmetic")}
    with pytest.raises(GateError, match="parse rate below 50%.*arithmetic 0%.*SFT is not done"):
        format_gate(GateSpec(min_parse_rate=0.5, n_problems=8), sampler, tokenizer, tasks, max_new_tokens=8)
    warned = format_gate(
        GateSpec(min_parse_rate=0.5, n_problems=8, on_fail="warn"), sampler, tokenizer, tasks, 8
    )
    assert warned["passed"] is False and warned["parse_rates"] == {"arithmetic/parse_rate": 0.0}
    passing = format_gate(GateSpec(min_parse_rate=0.0, n_problems=8), sampler, tokenizer, tasks, 8)
    assert passing["passed"] is True


def test_lora_rl_stage_uses_the_adapter_disabled_base_as_reference(tokenizer, tmp_path):
    from temper.models import load_model, save_model
    from temper.stages.context import StageContext
    from temper.stages.rl import RLStage, run_rl

    base = build_preset("nano", tokenizer, seed=1)
    save_model(base, tokenizer, tmp_path / "base")
    stage = RLStage(
        kind="rl",
        tasks=["first_byte"],
        lora={"r": 4, "alpha": 8},
        probe_groups=4,
        train=_config(steps=3, kl_coef=0.1, lr=1e-2),
    )
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    out = tmp_path / "rl"
    out.mkdir()
    merged = run_rl(stage, ctx, tmp_path / "base", out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # adapter B starts at zero: policy == reference
    assert rows[-1]["kl"] > 0 and rows[-1]["kl_ref"] != 0  # k3 (the loss term) is >= 0; k1 may be either sign
    trained = load_model(merged)  # adapter merged into plain weights
    assert not any("lora" in n for n, _ in trained.named_parameters())
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters()))
    probe = json.loads((out / "probe.json").read_text())["probe"]
    assert probe["groups"] == 4 and 0 <= probe["zero_variance"] <= 1
