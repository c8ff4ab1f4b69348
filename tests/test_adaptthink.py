"""AdaptThink (`advantage: adaptthink`): the advantage by hand, the forced first token of the
rollout (importance sampling), the two-mode task, micro-batch invariance of the update, delta
moving the update, the recipe rules, and a micro-run of train_rl."""

import json
import math
from dataclasses import replace

import pytest
import torch

from temper.algorithms.adaptthink import adaptthink_advantages, first_token_logprobs
from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
from temper.catalog import make_recipe_task
from temper.models import build_preset
from temper.rollout.sampler import Sample, derive_seed
from temper.tasks.base import Problem, Score
from temper.tasks.two_mode import DIRECT, THINK, marker_ids, mode_of
from temper.train.features import BatchExtras, Step
from temper.train.features.adaptthink import (
    REFERENCE_FILE,
    AdaptThinkConfig,
    AdaptThinkRun,
    ForcedFirstToken,
    direct_flags,
)
from temper.train.features.dynamic_sampling import DynamicSampling
from temper.train.rl import train_rl
from temper.train.rl_config import RLConfig, rl_rules
from temper.train.rl_update import loss_terms, policy_with_value, prepare
from temper.train.rollouts import Group, Rollout, one_step
from test_rl_update import _gradient, _off_policy, _rollouts

# ---- the advantage ------------------------------------------------------------------------------


def test_advantage_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    direct = torch.tensor([[True, True, False, False], [True, False, True, False]])
    ref = torch.tensor([0.5, 0.25])
    got = adaptthink_advantages(rewards, direct, ref, delta=0.1)
    # delta * 1(direct) + r - Rbar_ref: an all-wrong group still prefers the direct mode by delta
    want = torch.tensor([[0.6, -0.4, 0.5, -0.5], [-0.15, -0.25, -0.15, -0.25]])
    torch.testing.assert_close(got, want)
    # delta 0: the reward minus the reference, whatever the mode
    torch.testing.assert_close(adaptthink_advantages(rewards, direct, ref, 0.0), rewards - ref[:, None])


def test_advantage_shapes_are_checked():
    with pytest.raises(ValueError, match="both be"):
        adaptthink_advantages(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2), 0.1)
    with pytest.raises(ValueError, match="ref_accuracy"):
        adaptthink_advantages(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), torch.zeros(3), 0.1)


def test_estimator_broadcasts_the_advantage_over_each_samples_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    x = AdvantageInputs(
        rewards_G_N=torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        mask_R_T=mask,
        extra={
            "direct_R": torch.tensor([True, False, False, True]),
            "ref_accuracy_G": torch.tensor([0.75, 1.0]),
            "delta": 0.2,
        },
    )
    adv, returns = ESTIMATORS["adaptthink"](x)
    per_sample = torch.tensor([0.45, -0.75, 0.0, 0.2])
    torch.testing.assert_close(adv, torch.where(mask, per_sample[:, None], 0.0))
    assert returns is None
    with pytest.raises(ValueError, match="needs direct_R"):
        ESTIMATORS["adaptthink"](replace(x, extra={k: v for k, v in x.extra.items() if k != "direct_R"}))


def test_first_token_logprobs_are_log_pi_is():
    direct = torch.tensor([True, False, True])
    torch.testing.assert_close(
        first_token_logprobs(direct, 0.25), torch.tensor([math.log(0.25), math.log(0.75), math.log(0.25)])
    )
    with pytest.raises(ValueError):
        first_token_logprobs(direct, 1.0)


# ---- the two-mode task --------------------------------------------------------------------------


def _two_mode(**kw):
    return make_recipe_task("modes", {"task": "two_mode", "base": "arithmetic", **kw})


def test_two_mode_demonstrations_grading_and_markers(tokenizer):
    task = _two_mode(direct_share=0.5)
    problems = task.sample("train", 400, seed=0)
    assert {p.task for p in problems} == {"modes"}  # the recipe's name, for eval tables and logs
    demos = [task.demonstration(p) for p in problems]
    modes = [mode_of(d) for d in demos]
    assert set(modes) == {"think", "direct"}
    assert 0.4 < modes.count("direct") / len(modes) < 0.6
    p = next(p for p in problems if task.direct(p))
    assert task.demonstration(p) == f"{DIRECT} {p.data['answer']}"
    p = next(p for p in problems if not task.direct(p))
    d = p.data
    assert task.demonstration(p) == f"{THINK} {d['a']}{d['op']}{d['b']}={d['answer']}\nAnswer: {d['answer']}"
    assert all(task.score(p, demo).correct for p, demo in zip(problems, demos))
    assert mode_of("Answer: 3") == "direct" and mode_of("Think: 1+2=3\nAnswer: 3") == "think"
    assert mode_of("3") == "other"
    assert marker_ids(tokenizer) == (
        tokenizer.encode("A", add_special_tokens=False)[0],
        tokenizer.encode("T", add_special_tokens=False)[0],
    )
    assert {mode_of(_two_mode(direct_share=0.0).demonstration(p)) for p in problems} == {"think"}
    assert {mode_of(_two_mode(direct_share=1.0).demonstration(p)) for p in problems} == {"direct"}


def test_two_mode_options_are_checked():
    from temper.tasks.base import TaskOptionError

    with pytest.raises(TaskOptionError):
        _two_mode(direct_share=1.5)
    with pytest.raises(TaskOptionError):
        _two_mode(base="no_such_task")
    with pytest.raises(TaskOptionError):
        _two_mode(options={"max_digitz": 2})


# ---- the forced first token ---------------------------------------------------------------------


class _Recorder:
    """A sampler that returns two fixed tokens per sample and records its calls."""

    def __init__(self):
        self.calls = []
        self.model = "the backend's model"

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop=(), seed=0):
        self.calls.append((prompts, n, max_new_tokens, list(seed)))
        return [[Sample(list(p), [50, 51], [-1.0, -2.0], "23", "length") for _ in range(n)] for p in prompts]

    def sync(self, model):
        self.calls.append(("sync", model))


def test_forced_first_token_splits_each_group_and_records_log_pi_is(tokenizer):
    inner = _Recorder()
    direct_id, think_id = marker_ids(tokenizer)
    sampler = ForcedFirstToken(inner, tokenizer, 0.25)
    out = sampler.sample([[1, 2], [3]], 4, max_new_tokens=5, seed=[7, 8])
    # one call per mode: the prompts + the forced token, one token less to sample, derived seeds
    assert inner.calls == [
        ([[1, 2, direct_id], [3, direct_id]], 1, 4, [derive_seed(7, 1), derive_seed(8, 1)]),
        ([[1, 2, think_id], [3, think_id]], 3, 4, [derive_seed(7, 2), derive_seed(8, 2)]),
    ]
    for prompt, samples in zip([[1, 2], [3]], out):
        assert [s.token_ids for s in samples] == [[direct_id, 50, 51]] + [[think_id, 50, 51]] * 3
        assert [s.logprobs for s in samples] == [[math.log(0.25), -1.0, -2.0]] + [
            [math.log(0.75), -1.0, -2.0]
        ] * 3
        assert [s.text for s in samples] == ["A23"] + ["T23"] * 3
        assert all(s.prompt_ids == prompt for s in samples)
    assert direct_flags([s.token_ids[0] for s in out[0]] + [None], tokenizer).tolist() == [
        True,
        False,
        False,
        False,
        False,
    ]
    sampler.sync("m")
    assert inner.calls[-1] == ("sync", "m") and sampler.model == "the backend's model"
    # share 0: every sample thinks, with log 1 = 0 at the forced token (the reference's samples)
    thinking = ForcedFirstToken(_Recorder(), tokenizer, 0.0).sample([[1]], 2, max_new_tokens=3, seed=0)
    assert [s.token_ids[0] for s in thinking[0]] == [think_id] * 2 and thinking[0][0].logprobs[0] == 0.0


# ---- the update ---------------------------------------------------------------------------------


def _config(**kw) -> RLConfig:
    base = dict(
        advantage="adaptthink",
        adaptthink=AdaptThinkConfig(delta=0.3),
        temperature=0.7,
        max_new_tokens=8,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=1.5,
    )
    return RLConfig(**(base | kw))


def _prepared(tokenizer, config, on_policy=False):
    torch.manual_seed(0)
    module = policy_with_value(build_preset("nano", tokenizer, seed=1), config).to(torch.float64)
    batch = _rollouts(vocab=len(tokenizer))  # G = N = 3
    if not on_policy:
        batch = _off_policy(module, batch)
    else:
        batch = _off_policy(module, batch, noise=0.0)
    extras = BatchExtras(
        {
            "direct_R": torch.tensor([True, False, True, False, False, True, True, True, False]),
            "ref_accuracy_G": torch.tensor([0.5, 0.25, 1.0]),
            "delta": config.adaptthink.delta,
        }
    )
    return module, prepare(batch, module, None, config, extras=extras)


@pytest.mark.parametrize("aggregation", ["token", "sample", "constant"])
def test_micro_batches_sum_to_the_full_batch_gradient(tokenizer, aggregation):
    config = _config(aggregation=aggregation)
    module, p = _prepared(tokenizer, config)
    terms = loss_terms(config, p)
    full, _ = _gradient(module, p, terms, config)
    assert full.abs().max() > 1e-5
    for micro in (1, 2, 4):
        split, _ = _gradient(module, p, terms, replace(config, micro_batch_size=micro))
        torch.testing.assert_close(split, full, rtol=1e-10, atol=1e-12)


def test_delta_moves_the_update_by_delta_times_the_direct_samples_gradient(tokenizer):
    # on-policy (ratio 1, no clip active), the policy gradient is linear in the advantage, so
    # grad(delta) - grad(0) = delta x the gradient of the loss whose advantage is 1(direct)
    config = _config(dual_clip=None)
    module, p = _prepared(tokenizer, config, on_policy=True)
    with_delta, _ = _gradient(module, p, loss_terms(config, p), config)
    no_bonus = replace(config, adaptthink=AdaptThinkConfig(delta=0.0))
    _, p0 = _prepared(tokenizer, no_bonus, on_policy=True)
    without, _ = _gradient(module, p0, loss_terms(no_bonus, p0), no_bonus)
    assert (with_delta - without).abs().max() > 1e-4
    direct_only = replace(p, advantages=torch.where(p.mask, p.advantages - p0.advantages, 0.0) / 0.3)
    torch.testing.assert_close(
        direct_only.advantages[0, 0], torch.tensor(1.0, dtype=direct_only.advantages.dtype)
    )
    unit, _ = _gradient(module, direct_only, loss_terms(config, direct_only), config)
    # to the fp32 rounding of the advantages (rewards are fp32)
    torch.testing.assert_close(with_delta - without, 0.3 * unit, rtol=1e-5, atol=1e-7)


# ---- rules and a micro-run ----------------------------------------------------------------------


def test_the_hook_gives_the_estimator_the_blocks_delta_and_each_samples_mode(tokenizer):
    """The feature's inputs of a step's batch: delta from the block, the mode off each sample's
    first token, each prompt's reference accuracy."""
    direct_id, think_id = marker_ids(tokenizer)

    def rollout(pid, first):
        sample = Sample([1, 2], [first, 9], [-0.1, -0.2], "x", "eos")
        score = Score(1.0, True, True, {})
        return Rollout(Problem("t", "train", pid, "q"), one_step(sample, score), score, 1.0, {})

    groups = [Group([rollout("a", direct_id), rollout("a", think_id)]), Group([rollout("b", think_id)] * 2)]
    hooks = AdaptThinkRun(AdaptThinkConfig(delta=0.37), tokenizer, None, 1.0, {"a": 0.25, "b": 0.75})
    extras = hooks.extras(Step(1, groups, groups, groups), batch=None)
    assert extras.inputs["delta"] == 0.37 and extras.reference_prompts is None
    assert extras.inputs["direct_R"].tolist() == [True, False, False, False]
    assert extras.inputs["ref_accuracy_G"].tolist() == [0.25, 0.75]


def test_rules_tie_the_block_to_the_advantage():
    assert rl_rules(_config()) == []
    assert rl_rules(_config(adaptthink=None))[0][0] == ("train", "adaptthink")
    assert rl_rules(_config(advantage="grpo"))[0][0] == ("train", "adaptthink")
    assert rl_rules(_config(group_size=1))[0][0] == ("train", "adaptthink", "direct_share")
    assert rl_rules(_config(dynamic_sampling=DynamicSampling()))[0][0] == ("train", "dynamic_sampling")
    assert rl_rules(_config(rewards={"outcome": 1.0, "process": 0.5}))[0][0] == (
        "train",
        "rewards",
        "process",
    )
    assert rl_rules(_config(group_size=1, adaptthink=AdaptThinkConfig(direct_share=None))) == []


class ModeTask:
    """Both modes are always right (a completion starting with either marker's first token), so
    the reference accuracy is 1 and the advantage is delta on direct samples, 0 on thinking ones."""

    name = "modes_only"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{seed}-{i}", f"q{(seed + i) % 5}") for i in range(n)]

    def score(self, problem, completion):
        ok = completion[:1] in (DIRECT[0], THINK[0])
        return Score(float(ok), ok, True, {"reason": "correct" if ok else "wrong"})

    def demonstration(self, problem):
        return "A"

    def corpus_text(self, problem):
        return problem.prompt


def _micro_run(tokenizer, path, delta):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    config = RLConfig(
        advantage="adaptthink",
        adaptthink=AdaptThinkConfig(delta=delta, reference_samples=2),
        steps=8,
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=2,
        lr=3e-3,
        progress=False,
    )
    return train_rl(model, tokenizer, [ModeTask()], config, path).history


def test_train_rl_micro_run_raises_the_direct_probability_by_delta_alone(tokenizer, tmp_path):
    rows = _micro_run(tokenizer, tmp_path / "delta", 1.0)
    reference = json.loads((tmp_path / "delta" / REFERENCE_FILE).read_text())
    assert set(reference.values()) == {1.0}  # forced to think, always right
    assert all(r["adaptthink/direct_samples"] == 0.5 for r in rows)  # forced: half of each group
    assert all(r["adaptthink/accuracy_direct"] == 1.0 for r in rows)
    p_direct = [r["adaptthink/p_direct"] for r in rows]
    assert p_direct[-1] > 2 * p_direct[0], p_direct
    # delta 0: every advantage is r - Rbar_ref = 1 - 1 = 0, so nothing moves (p_direct is the
    # mean over each step's prompts, q0..q4, which differ by ~1% at the start)
    flat = _micro_run(tokenizer, tmp_path / "zero", 0.0)
    assert all(r["grad_norm"] == 0.0 and r["loss"] == 0.0 for r in flat)
    assert max(r["adaptthink/p_direct"] for r in flat) < 1.05 * p_direct[0] < p_direct[-1] / 1.5


def test_the_block_enters_the_stage_hash_only_when_set():
    # runs recorded before the field existed keep their hash (and stay complete)
    from temper.stages.markers import stage_settings
    from temper.stages.rl import RLStage

    plain = RLStage(kind="rl", tasks=["arithmetic"])
    assert "adaptthink" not in stage_settings(plain)["train"]
    assert "progress" not in stage_settings(plain)["train"]
    adapt = RLStage(kind="rl", tasks=["arithmetic"], train=_config(temperature=1.0))
    assert stage_settings(adapt)["train"]["adaptthink"]["delta"] == 0.3
