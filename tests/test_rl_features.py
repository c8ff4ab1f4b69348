"""The RL feature protocol (`temper.train.features`): the registry finds every feature and makes
its block a `train:` key; a block that replaced flat keys hashes as they did and its old form is
refused with the new one; each block's settings reach the hook or scorer that uses them; and a
feature's hooks run at their points of `train_rl`, with what the protocol promises them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pydantic
import pytest
import torch

from fakes import PatternSampler, YesTask  # noqa: E402  (tests/ is on sys.path)
from temper.models import build_preset
from temper.rewards.judge import JudgeSpec
from temper.rewards.monitors import MonitorConfig
from temper.rewards.path import PathSpec, normalize_in_group
from temper.rewards.process_reward_model import TokenRewards
from temper.rollout.sampler import Sample
from temper.stages.markers import stage_settings
from temper.stages.rl import RLStage
from temper.tasks.base import Problem, Score
from temper.train import features, rl
from temper.train.features import BLOCKS, FEATURES, Hooks, RLFeature, RunStart, ScorerSetup, Step
from temper.train.features.adaptthink import AdaptThinkConfig, AdaptThinkRun, ForcedFirstToken
from temper.train.features.base import BatchExtras, SetupError
from temper.train.features.dynamic_sampling import DynamicSampling
from temper.train.features.process_reward_model import ProcessRewardModelSpec
from temper.train.rl import RLConfig, train_rl
from temper.train.rollouts import Group, Rollout, grade_episodes, one_step


def _run(**kw) -> RunStart:
    base = dict(model=None, tokenizer=None, tasks=[], sampler=None, out_dir=Path("/nonexistent"), main=False,
                start=0, past=[], problems=lambda step: [], limits=None)  # fmt: skip
    return RunStart(**(base | kw))


def _rollout(reward=1.0, signals=None, first=7):
    sample = Sample([1, 2], [first, 8], [-0.5, -0.5], "x", "eos")
    score = Score(reward, reward > 0, True, {})
    r = Rollout(Problem("t", "train", "p", "q"), one_step(sample, score), score, reward, {})
    if signals is not None:
        r.trajectory.signals = [signals]
    return r


# ---- the registry -----------------------------------------------------------------------------


def test_every_feature_is_found_and_its_block_is_a_train_key_with_its_default():
    assert [f.name for f in FEATURES] == [
        "user_code",  # first: a step whose user code failed stops before any other hook
        "dynamic_sampling",
        "adaptthink",
        "teacher_context",
        "reward_model",
        "process_reward_model",
        "judge",
        "path",
        "parallel",
        "curriculum",
        "rollout_correction",
        "async_rollouts",  # rules and settings only: the loop reads its block (temper.train.pipeline)
        "monitors",
        "workers",  # last: the envs it sends to its workers are the ones every other hook saw
    ]  # fmt: skip (in hook order)
    fields = {f.name: f for f in dataclasses.fields(RLConfig)}
    for f in BLOCKS:
        default = fields[f.name].default_factory() if callable(f.default) else fields[f.name].default
        assert default == (f.default() if callable(f.default) else f.default), f.name
    assert "curriculum" not in fields  # a feature without settings adds no key
    # the block's description is the --help text
    schema = pydantic.TypeAdapter(RLConfig).json_schema()["properties"]
    assert schema["adaptthink"]["description"].startswith("AdaptThink's settings")
    assert schema["steps"]["description"] == "RL steps (one rollout batch and its updates each)."


def test_a_block_that_replaced_flat_keys_hashes_as_they_did_and_their_old_form_is_refused():
    def train(**kw):
        return stage_settings(RLStage(kind="rl", tasks=["t"], train=RLConfig(**kw)))["train"]

    assert train()["dynamic_sampling"] is False and train()["max_sampling_rounds"] == 4
    on = train(dynamic_sampling=DynamicSampling(max_rounds=6))
    assert on["dynamic_sampling"] is True and on["max_sampling_rounds"] == 6
    assert "process_reward_model" not in train() and "adaptthink" not in train()  # added later: left out
    for old, says in [
        ({"dynamic_sampling": True}, "is a block: dynamic_sampling: {max_rounds: 4}"),
        ({"max_sampling_rounds": 3}, "moved into the dynamic_sampling block"),
        ({"process_reward_model": "prm"}, "is a block: process_reward_model: {model: prm, mode:"),
        ({"process_reward_model_mode": "min"}, "moved into the process_reward_model block"),
    ]:
        with pytest.raises(pydantic.ValidationError, match=rf"train\.{next(iter(old))}: ") as err:
            RLStage.model_validate({"kind": "rl", "tasks": ["t"], "train": old})
        assert says in str(err.value)


# ---- each block reaches what uses it ----------------------------------------------------------


def test_dynamic_sampling_max_rounds_reaches_the_refill():
    on = features.start(RLConfig(dynamic_sampling=DynamicSampling(max_rounds=7)), _run())
    assert on.rounds == 7 and not on.keep(Group([], cause="all_wrong")) and on.keep(Group([]))
    off = features.start(RLConfig(), _run())
    assert off.rounds == 1 and off.keep(Group([], cause="all_wrong"))


def test_adaptthink_direct_share_reaches_the_forced_sampler(tokenizer):
    inner = object()
    forced = AdaptThinkRun(AdaptThinkConfig(direct_share=0.25), tokenizer, None, 1.0, {}).sampler(inner)
    assert isinstance(forced, ForcedFirstToken) and forced.direct_share == 0.25 and forced.inner is inner
    on_policy = AdaptThinkRun(AdaptThinkConfig(direct_share=None), tokenizer, None, 1.0, {})
    assert on_policy.sampler(inner) is inner


def test_the_path_block_reaches_the_group_rewards():
    spec = PathSpec(beta=0.3, milestones={"m": 1.0}, eps=0.5)
    [shape] = features.shapers(RLConfig(path=spec), 1)
    assert features.shapers(RLConfig(), 1) == []
    rollouts = [_rollout(1.0, {"m": v}) for v in (0.0, 1.0, 3.0)]
    z = normalize_in_group([0.0, 1.0, 3.0], 0.5)
    assert shape(rollouts) == [
        ({"path": p, "path_norm": zi}, 0.3 * zi) for p, zi in zip([0, 1, 3], z, strict=True)
    ]
    group = grade_episodes(rollouts[0].problem, [r.trajectory for r in rollouts], {"outcome": 2.0}, 8, 0,
                           shapers=[shape])  # fmt: skip
    assert [r.final_reward for r in group.rollouts] == [2.0 + 0.3 * zi for zi in z] == group.rewards


def test_teacher_context_turns_on_the_teacher_prompts_only_with_solution():
    assert not any(type(h).__name__ == "PrivilegedRun" for h in features.start(RLConfig(), _run()).hooks)
    on = features.start(RLConfig(teacher_context="solution"), _run())
    assert [type(h).__name__ for h in on.hooks if type(h).__name__ == "PrivilegedRun"] == ["PrivilegedRun"]


def _setup(folders, judged=None):
    return ScorerSetup(
        tokenizer="the policy's tokenizer", device="cpu",
        folder=lambda ref, kind: folders.append((ref, kind)) or Path("/models") / kind / ref,
        judge=lambda spec: judged.append(spec) or _Judge(spec),
    )  # fmt: skip


class _Judge:
    def __init__(self, spec):
        self.spec = spec

    def grade(self, prompts, responses):
        return [SimpleNamespace(value=0.25) for _ in prompts]


def test_the_scorer_blocks_reach_their_models(monkeypatch):
    from temper.train.features import process_reward_model, reward_model

    loaded = []
    monkeypatch.setattr(
        reward_model.RewardModel, "load", classmethod(lambda cls, path, device=None: loaded.append((path, device))
                                                       or SimpleNamespace(score=lambda p, c: [0.5] * len(p))),
    )  # fmt: skip

    class _PRM:
        tokenizer = None

        @classmethod
        def load(cls, path, device=None):
            loaded.append((path, device))
            return cls()

        def step_rewards(self, prompts, completions, batch_size):
            return [TokenRewards((0, 1), (0.9, 0.2)) for _ in prompts]

    monkeypatch.setattr(process_reward_model, "ProcessRewardModel", _PRM)
    monkeypatch.setattr(process_reward_model, "tokenizer_mismatch", lambda a, b: "")
    folders, judged = [], []
    config = RLConfig(
        reward_model="rm", process_reward_model=ProcessRewardModelSpec("prm", mode="min"),
        judge=JudgeSpec(fallback=0.5), rewards={"reward_model": 1.0, "process_reward_model": 1.0, "judge": 1.0},
    )  # fmt: skip
    scorers = features.scorers(config, _setup(folders, judged))
    assert list(scorers) == ["reward_model", "process_reward_model", "judge"]
    assert folders == [("rm", "reward_model"), ("prm", "process_reward_model")]
    assert loaded == [
        (Path("/models/reward_model/rm"), "cpu"),
        (Path("/models/process_reward_model/prm"), "cpu"),
    ]
    assert judged == [config.judge]
    episodes = [[_rollout().trajectory, _rollout().trajectory]]
    problems = [Problem("t", "train", "p", "q")]
    assert scorers["reward_model"](problems, episodes) == [[{"reward_model": 0.5}] * 2]
    assert scorers["process_reward_model"](problems, episodes)[0][0]["process_reward_model"] == 0.2  # min
    assert scorers["judge"](problems, episodes)[0][0]["judge"] == 0.25
    assert features.scorers(RLConfig(), _setup([])) == {}
    monkeypatch.setattr(
        process_reward_model, "tokenizer_mismatch", lambda a, b: "vocabularies of 3 and 4 tokens"
    )
    with pytest.raises(SetupError, match="'prm' does not share the policy's tokenizer"):
        features.scorers(config, _setup([], []))


def test_the_monitors_block_reaches_the_monitors():
    hooks = features.start(RLConfig(monitors=MonitorConfig(window=3, min_steps=2)), _run())
    [monitors] = [h for h in hooks.hooks if type(h).__name__ == "Monitors"]
    assert monitors.config == MonitorConfig(window=3, min_steps=2)
    for step in range(1, 8):
        hooks.after_step(Step(step, [], [], []), {"step": step, "reward": float(step), "accuracy": 0.5})
    assert [r["step"] for r in monitors.past] == [4, 5, 6, 7]  # the window (3) and the row being made
    assert all(
        type(h).__name__ != "Monitors"
        for h in features.start(RLConfig(monitors=MonitorConfig(enabled=False)), _run()).hooks
    )


# ---- a feature in the loop --------------------------------------------------------------------


class _Toy(Hooks):
    """Records what each hook is given; adds a metric at each point."""

    def __init__(self, run):
        self.run, self.calls = run, []

    def sampler(self, sampler):
        self.calls.append(("sampler", sampler))
        return sampler

    def after_grading(self, step):
        self.calls.append(("after_grading", step.step, len(step.groups), len(step.local), len(step.graded)))
        return {"toy/graded": len(step.graded)}

    def extras(self, step, batch):
        self.calls.append(("extras", step.step, len(batch.prompts)))
        return BatchExtras(reference_prompts=[[1] + p for p in batch.prompts])

    def after_step(self, step, row):
        self.calls.append(("after_step", step.step, "loss" in row, "eval/acc" in row, row["toy/graded"]))
        return {"toy/seen": 1}


def test_a_feature_runs_at_its_points_of_the_loop(tokenizer, tmp_path, monkeypatch):
    made = []
    toy = RLFeature(name="toy", start=lambda config, run: made.append(_Toy(run)) or made[-1])
    monkeypatch.setattr(features, "FEATURES", (*FEATURES, toy))
    given = []
    real = rl.prepare
    monkeypatch.setattr(rl, "prepare", lambda *a: given.append(a[-1]) or real(*a))
    model, reference = build_preset("nano", tokenizer, seed=0), build_preset("nano", tokenizer, seed=1)
    sampler = PatternSampler([[True, True], [True, False]])
    config = RLConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, kl_coef=0.1, eval_every=2,
                      progress=False, monitors=MonitorConfig(enabled=False))  # fmt: skip
    result = train_rl(model, tokenizer, [YesTask()], config, tmp_path, sampler=sampler, reference=reference,
                      evaluate=lambda step: {"acc": 1.0})  # fmt: skip
    [hooks] = made
    assert hooks.run.start == 0 and hooks.run.tasks[0].name == "toy" and hooks.run.model is model
    assert hooks.calls == [
        ("sampler", sampler),
        ("after_grading", 1, 2, 2, 2), ("extras", 1, 4), ("after_step", 1, True, False, 2),
        ("after_grading", 2, 2, 2, 2), ("extras", 2, 4), ("after_step", 2, True, True, 2),
    ]  # fmt: skip
    assert all(row["toy/graded"] == 2 and row["toy/seen"] == 1 for row in result.history)
    # the reference read the prompts the feature gave, beside the batch (which holds the student's)
    assert [len(e.reference_prompts) for e in given] == [4, 4] and given[0].reference_prompts[0][0] == 1
    assert torch.isfinite(torch.tensor(result.history[-1]["kl_ref"]))


def test_the_envs_hook_replaces_a_rounds_envs_and_close_reaches_every_hook_when_one_fails():
    closed = []

    class Doubling(Hooks):
        def envs(self, envs_G_N):
            return [g + g for g in envs_G_N]

        def close(self):
            closed.append("doubling")
            raise RuntimeError("first")

    class Last(Hooks):
        def close(self):
            closed.append("last")

    hooks = features.Features([Doubling(), Last()])
    assert hooks.envs([["a"], ["b"]]) == [["a", "a"], ["b", "b"]]
    with pytest.raises(RuntimeError, match="first"):
        hooks.close()
    assert closed == ["doubling", "last"]
