"""The optional capabilities of tasks, envs and samplers are named protocols (`temper.tasks.base`,
`temper.envs.base`, `temper.rollout.sampler`), checked with `isinstance`: every shipped task of
the catalog, and the env it plays, is an instance of exactly the protocols of what it implements;
a user's class that has the member is one without subclassing; a member set to None is absent."""

from __future__ import annotations

import importlib.util
import inspect
import json

import pytest

from temper.catalog import TASKS, make_recipe_task
from temper.envs import base as envs
from temper.envs.base import TaskEnv, make_env, tools_of
from temper.rollout import HFSampler
from temper.rollout.sampler import HoldsModel, StopsAtTokens, model_of, sampler_stop_ids
from temper.stages.prompt_distill import Instructed
from temper.tasks import base as tasks
from temper.tasks.base import Problem, Score, curriculum_of, grade_batch, path_signals_of
from temper.train.features.adaptthink import ForcedFirstToken

ENV_SOURCE = """
from temper.envs.base import StepResult


class Echo:
    stop = ()

    def __init__(self, row):
        self.row = row

    def reset(self):
        return []

    def step(self, action):
        return StepResult(done=True)


def make_env(row):
    return Echo(row)
"""

OPTIONS = {
    "dataset": {"data": "rows.jsonl"},
    "gateway": {"data": "rows.jsonl", "agent": "agent.py"},
    "reasoning_gym": {"dataset": "leg_counting", "size": 10},
    "two_mode": {"base": "arithmetic"},
    "translated": {"base": "arithmetic"},
    "thinking_language": {"base": "arithmetic"},
    "code_repair": {"train_tasks": 4, "test_tasks": 2, "ood_tasks": 2},
    "shell_repo": {"train_tasks": 2, "test_tasks": 1, "ood_tasks": 1},
    "web_shop": {"train_tasks": 2, "test_tasks": 1, "ood_tasks": 1},
}
"""The options a catalog task needs to be built (the rest build with their defaults)."""

ENV_TASKS = {
    "calculator_arithmetic",
    "code_repair",
    "treasure_hunt",
    "multi_tool",
    "orchestrator",
    "simulated_search",
    "memory_corridor",
    "prune_lookup",
    "shell_repo",
    "web_shop",
    "user_env",
    "gateway",
}

TASK_CAPABILITIES = {
    tasks.BatchScored: {"dataset", "user_env", "gateway"},
    tasks.Fingerprinted: {"dataset", "user_env", "two_mode", "translated", "thinking_language", "gateway"},
    tasks.SamplesAtStep: {"code_repair", "simulated_search", "web_shop"},
    tasks.DeclaresPathSignals: {"code_repair", "multi_tool", "shell_repo"},
    tasks.CurriculumTask: {"code_repair", "web_shop"},
    tasks.DemonstratesEpisodes: {
        "code_repair",
        "multi_tool",
        "orchestrator",
        "shell_repo",
        "simulated_search",
        "treasure_hunt",
        "web_shop",
    },
    tasks.MarksEnvironmentSpans: {"calculator_arithmetic"},
    tasks.DemonstratesRows: {"memory_corridor", "prune_lookup"},
    envs.EpisodeTokenLimited: {"memory_corridor", "prune_lookup"},
    envs.EnvTask: ENV_TASKS,
    envs.TurnLimited: ENV_TASKS,
    envs.OffersTools: {"multi_tool"},
}
"""Protocol -> the shipped tasks (catalog names; `user_env`: a dataset entry with `env:`) that are one."""

CLASS_CAPABILITIES = {
    tasks.BuiltFromRecipe: {"dataset", "user_env", "reasoning_gym", "simulated_search", "gateway"},
    tasks.WrapsTask: {"two_mode", "translated", "thinking_language"},
}
"""The protocols of a task class (classmethods the catalog calls), checked on the class."""

ENV_CAPABILITIES = {
    envs.Cuttable: {"code_repair", "orchestrator", "shell_repo", "user_env", "gateway"},
    envs.Closable: {"calculator_arithmetic", "code_repair", "shell_repo", "web_shop", "user_env", "gateway"},
    envs.StepsInBatch: {"simulated_search", "arithmetic"},
    envs.Labelled: {"user_env", "gateway"},
    envs.DescribesCalls: {"user_env", "gateway"},
    envs.OffersTools: {"multi_tool", "user_env", "gateway"},
    envs.ManagesContext: {"memory_corridor", "prune_lookup"},
    envs.GradesSummaries: {"memory_corridor"},
}
"""Protocol -> the tasks whose envs are one (`arithmetic`: the one-step `TaskEnv` of any single-turn task)."""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """Every catalog task, built (reasoning_gym only where it is installed), and a user env task."""
    folder = tmp_path_factory.mktemp("capabilities")
    (folder / "envs.py").write_text(ENV_SOURCE)
    (folder / "agent.py").write_text("")  # the gateway's agent script (never run here)
    rows = [{"prompt": f"say {w}", "answer": w} for w in ("cat", "dog", "owl", "emu")]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = [n for n in TASKS if n != "reasoning_gym" or importlib.util.find_spec("reasoning_gym")]
    out = {n: make_recipe_task(n, {"task": n, **OPTIONS.get(n, {})}, folder) for n in names}
    out["user_env"] = make_recipe_task(
        "user_env", {"task": "dataset", "data": "rows.jsonl", "env": "envs.py:make_env"}, folder
    )
    return out


@pytest.fixture(scope="module")
def shipped_envs(shipped):
    """The env each shipped environment task plays (and arithmetic's one-step TaskEnv)."""
    played = [n for n, t in shipped.items() if isinstance(t, envs.EnvTask)] + ["arithmetic"]
    out = {n: make_env(shipped[n], shipped[n].sample("train", 1, 0)[0]) for n in played}
    yield out
    for env in out.values():
        if isinstance(env, envs.Closable):
            env.close()


@pytest.mark.parametrize("protocol", list(TASK_CAPABILITIES), ids=lambda p: p.__name__)
def test_each_shipped_task_is_an_instance_of_the_protocols_it_implements_and_no_other(shipped, protocol):
    assert {n for n, t in shipped.items() if isinstance(t, protocol)} == TASK_CAPABILITIES[protocol]


@pytest.mark.parametrize("protocol", list(CLASS_CAPABILITIES), ids=lambda p: p.__name__)
def test_each_shipped_task_class_is_an_instance_of_its_class_protocols(shipped, protocol):
    assert {n for n, t in shipped.items() if isinstance(type(t), protocol)} == CLASS_CAPABILITIES[protocol]


@pytest.mark.parametrize("protocol", list(ENV_CAPABILITIES), ids=lambda p: p.__name__)
def test_each_shipped_env_is_an_instance_of_the_protocols_it_implements_and_no_other(shipped_envs, protocol):
    assert {n for n, e in shipped_envs.items() if isinstance(e, protocol)} == ENV_CAPABILITIES[protocol]


def test_every_catalog_task_is_enumerated(shipped):
    """A new catalog task is checked against every protocol here (its options go in OPTIONS)."""
    assert set(TASKS) - {"reasoning_gym"} <= set(shipped)


def test_the_shipped_envs_are_envs(shipped_envs):
    assert all(isinstance(e, envs.Env) for e in shipped_envs.values())
    assert type(shipped_envs["arithmetic"]) is TaskEnv


class UsersGame:
    """A user's environment task: no temper base class, only the members."""

    name = "game"
    max_turns = 3
    path_signals = {"peeked": "violation"}

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        return [Problem("game", split, str(i), "play") for i in range(n)]

    def score(self, problem: Problem, completion: str) -> Score:
        return Score(1.0, True, True)

    def make_env(self, problem: Problem):
        return UsersEnv()


class UsersEnv:
    stop = ()
    tools = [{"type": "function", "function": {"name": "look"}}]

    def reset(self):
        return [{"role": "user", "content": "go"}]

    def step(self, action: str) -> envs.StepResult:
        return envs.StepResult(done=True)

    def close(self) -> None:
        pass


def test_a_users_class_with_the_members_is_recognised_without_subclassing():
    game = UsersGame()
    assert isinstance(game, envs.EnvTask) and isinstance(game, envs.TurnLimited)
    assert not isinstance(game, tasks.SamplesAtStep) and not isinstance(game, tasks.BatchScored)
    env = make_env(game, game.sample("train", 1, 0)[0])
    assert type(env) is UsersEnv  # its own env, not a one-step TaskEnv
    assert isinstance(env, envs.Closable) and not isinstance(env, envs.Cuttable)
    assert tools_of(env) == UsersEnv.tools and tools_of(game) is None
    assert path_signals_of(game) == {"peeked": "violation"} and path_signals_of(UsersGame) == path_signals_of(
        game
    )


def test_a_member_set_to_none_counts_as_absent():
    """`getattr(x, name, None) is not None` was the old probe: keep its meaning."""

    class Declined(UsersGame):
        make_env = None
        path_signals = None
        failure_curriculum = None
        tools = None

    task = Declined()
    assert not isinstance(task, envs.EnvTask)
    assert type(make_env(task, task.sample("train", 1, 0)[0])) is TaskEnv
    assert path_signals_of(task) == {} and tools_of(task) is None
    assert isinstance(task, tasks.CurriculumTask) and curriculum_of(task) is None


def test_every_protocol_says_who_implements_it():
    for p in [*TASK_CAPABILITIES, *CLASS_CAPABILITIES, *ENV_CAPABILITIES]:
        assert "Implemented by" in " ".join((p.__doc__ or "").split()), p.__name__


def test_wrappers_that_delegate_declare_the_capabilities_they_pass_on(shipped, tokenizer):
    """`isinstance` does not look through `__getattr__` on Python 3.12+: a delegating wrapper
    declares the capability members itself, so the check does not depend on the version."""
    data = shipped["dataset"]
    wrapped = Instructed(data, "Be brief.")
    assert inspect.getattr_static(wrapped, "score_batch", None) is not None
    problems = data.sample("train", 2, 0)
    assert grade_batch(wrapped, problems, ["cat", "Answer: nope"]) == grade_batch(
        data, problems, ["cat", "Answer: nope"]
    )

    class Engine:  # a sampler that runs no model in this process, with extra stop ids
        stop_token_ids = (tokenizer.eos_token_id + 1,)

        def sample(self, *args, **kwargs):
            raise AssertionError("not sampled")

    forced = ForcedFirstToken(Engine(), tokenizer, 0.5)
    for name in ("model", "stop_token_ids"):
        assert inspect.getattr_static(forced, name, None) is not None, name
    assert model_of(forced) is None
    assert sampler_stop_ids(forced, tokenizer) == sampler_stop_ids(Engine(), tokenizer)
    assert Engine.stop_token_ids[0] in sampler_stop_ids(forced, tokenizer)


def test_the_in_process_sampler_holds_its_model_and_a_wrapper_passes_it_on(nano, tokenizer):
    hf = HFSampler(nano, tokenizer)
    assert isinstance(hf, HoldsModel) and not isinstance(hf, StopsAtTokens)
    assert model_of(hf) is nano and model_of(ForcedFirstToken(hf, tokenizer, 0.5)) is nano
    assert model_of(object()) is None
