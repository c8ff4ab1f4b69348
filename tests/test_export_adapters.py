"""temper's tasks as other frameworks' environments (issue 31, item 6): a gymnasium env and an
OpenEnv server over any task, checked against the same temper env played directly (code_repair's
scripted repair in its real sandbox, treasure_hunt's BFS path with its shaping), and a round trip
temper -> OpenEnv -> temper through the inbound adapter."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from temper import guard
from temper.catalog import make_task
from temper.envs.base import StepResult
from temper.export.episode import TaskEpisodes, render

ROOT = Path(__file__).resolve().parents[1]
REPAIR = {"train_tasks": 3, "test_tasks": 1, "ood_tasks": 1}


@pytest.fixture(scope="module")
def repair():
    return make_task("code_repair", **REPAIR)


@pytest.fixture(scope="module")
def treasure():
    return make_task("treasure_hunt")


class Recording:
    """A task passed through unchanged, keeping every env it makes (to see each one closed)."""

    def __init__(self, task: Any):
        self.task, self.envs = task, []
        self.name, self.max_turns = task.name, task.max_turns

    def sample(self, split, n, seed):
        return self.task.sample(split, n, seed)

    def score(self, problem, completion):
        return self.task.score(problem, completion)

    def demonstration(self, problem):
        return self.task.demonstration(problem)

    def corpus_text(self, problem):
        return self.task.corpus_text(problem)

    def make_env(self, problem):
        self.envs.append(self.task.make_env(problem))
        return self.envs[-1]


def direct(task: Any, problem: Any, actions: list[str]) -> tuple[list[dict], list[StepResult]]:
    """The temper env of `problem` played directly: its prompt and every step's result."""
    env = task.make_env(problem)
    prompt, results = env.reset(), []
    try:
        for action in actions:
            results.append(env.step(action))
            if results[-1].done:
                break
    finally:
        if hasattr(env, "close"):
            env.close()
    return prompt, results


def gym_env(task, **kw):
    pytest.importorskip("gymnasium")
    from temper.export.gymnasium_env import TaskGymEnv

    return TaskGymEnv(task, **kw)


# ---------------------------------------------------------------- the gymnasium env


def test_a_code_repair_demonstration_through_the_gym_env_is_the_direct_episode(repair):
    env = gym_env(repair, n_problems=3)
    problem = env.episode.problems[1]
    commands = repair.commands(problem)
    prompt, results = direct(repair, problem, commands)

    observation, info = env.reset(seed=0, options={"problem_index": 1})
    assert observation == "fix sol.py" == prompt[0]["content"] and info["messages"] == prompt
    assert info["problem_id"] == problem.id and info["turn"] == 0 and info["stop"] == []
    workspace = env.episode.env.workspace
    assert workspace.is_dir()  # the real sandbox workspace of the live episode
    for i, (command, want) in enumerate(zip(commands, results, strict=True)):
        observation, reward, terminated, truncated, info = env.step(command)
        last = i == len(commands) - 1
        assert observation == render(want.messages) and info["signals"] == want.signals
        assert (terminated, truncated) == (last, False) and info["turn"] == i + 1
        assert reward == (want.score.reward if last else 0.0)  # code_repair's steps give 0
    assert observation == "" and info["score"] == dataclasses.asdict(want.score)
    assert info["score"]["details"]["reason"] == "pass" and info["outcome_reward"] == 1.0
    assert not workspace.exists() and env.episode.env is None  # closed at the end, not at reset
    with pytest.raises(RuntimeError, match="reset first"):
        env.step("submit")


def test_the_browser_agent_through_the_gym_env_is_the_direct_episode_and_frees_its_server():
    shop = make_task("web_shop", train_tasks=2, test_tasks=1, ood_tasks=1)
    env = gym_env(shop, n_problems=2)
    problem = env.episode.problems[0]
    actions = shop.commands(problem)
    prompt, results = direct(shop, problem, actions)
    observation, info = env.reset(seed=0, options={"problem_index": 0})
    assert observation == prompt[0]["content"] and observation.startswith(problem.prompt + "\n[1] textbox")
    server = env.episode.env.server
    assert server is not None and server.base.startswith("http://127.0.0.1:")
    for i, (action, want) in enumerate(zip(actions, results, strict=True)):
        observation, reward, terminated, truncated, info = env.step(action)
        assert observation == render(want.messages) and terminated == (i == len(actions) - 1)
    assert info["score"]["correct"] and info["score"]["details"]["reason"] in ("ordered", "right_answer")
    assert server._server is None  # the episode's HTTP server is shut down at the end


def test_treasure_rewards_invalid_answers_and_weights_are_the_direct_envs(treasure):
    env = gym_env(treasure, split="test", seed=3, process=0.5, outcome=2.0)
    problem = next(p for p in env.episode.problems if len(p.data["path"]) <= 5)  # room for detours
    path = problem.data["path"]
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}[path[0]]
    # answers treasure_hunt does not understand, and a step back (farther: a negative reward)
    actions = ["dance", path[0], back, path[0], "LEFT!!", *path[1:]]
    _, results = direct(treasure, problem, actions)
    assert results[0].signals["invalid"] == 1 and results[-1].score.correct  # the script is what it says

    env.reset(options={"problem_id": problem.id})
    returned = []
    for action, want in zip(actions, results, strict=True):
        observation, reward, terminated, truncated, info = env.step(action)
        final = 2.0 * want.score.reward if want.done else 0.0
        assert reward == pytest.approx(0.5 * want.reward + final)
        assert info["process_reward"] == want.reward and info["signals"] == want.signals
        assert observation == render(want.messages)
        returned.append(reward)
    assert terminated and not truncated and info["score"]["correct"]
    direct_return = 0.5 * sum(r.reward for r in results) + 2.0 * results[-1].score.reward
    assert sum(returned) == pytest.approx(direct_return)
    assert any(r.reward < 0 for r in results) and any(r.reward > 0 for r in results)  # weights visible


def test_actions_outside_the_space_are_refused_without_stepping_the_env(treasure):
    env = gym_env(treasure, max_action_chars=8)
    env.reset(seed=1)
    for bad, error in ((5, TypeError), ("up\u2019", ValueError), ("up" * 5, ValueError)):
        with pytest.raises(error):
            env.step(bad)
    assert env.episode.turn == 0  # none reached the temper env
    assert env.step("up")[4]["turn"] == 1
    with pytest.raises(ValueError, match="charset must hold"):
        gym_env(treasure, charset="abc")


def test_truncation_cuts_the_episode_and_every_end_frees_the_sandbox(repair):
    recorded = Recording(repair)
    env = gym_env(recorded, max_turns=2, n_problems=3)
    env.reset(options={"problem_index": 0})
    env.step("run_tests")
    _, reward, terminated, truncated, info = env.step("cat sol.py")
    assert truncated and not terminated and reward == 0.0
    assert info["score"] is None and info["outcome_reward"] is None
    assert info["signals"]["tests_untouched"] == 1 and info["signals"]["void_rule_broken"] == 0  # cut()
    env.reset(options={"problem_index": 1})  # live ...
    env.reset(options={"problem_index": 2})  # ... closed by the next reset
    env.close()  # and by close
    env.close()
    assert len(recorded.envs) == 3 and all(e.workspace is None for e in recorded.envs)
    assert all(e._sandbox is None for e in recorded.envs)


def test_check_env_passes_and_seeded_resets_replay(treasure, repair):
    gym = pytest.importorskip("gymnasium")
    from gymnasium.utils.env_checker import check_env

    made = gym.make(
        "temper.export.gymnasium_env:temper/TaskEnv-v0",
        task="treasure_hunt",
        options={"size": 5},
        split="test",
    )
    assert made.unwrapped.episode.task.config.size == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # check_env's complaints are warnings: none may come
        check_env(made.unwrapped)
        sandboxed = gym.make("temper/TaskEnv-v0", task=repair, n_problems=3)  # a task object too
        check_env(sandboxed.unwrapped)
    made.close()
    sandboxed.close()

    env = gym_env(treasure)
    first = [env.reset(seed=7)[1]["problem_id"]] + [env.reset()[1]["problem_id"] for _ in range(3)]
    again = [env.reset(seed=7)[1]["problem_id"]] + [env.reset()[1]["problem_id"] for _ in range(3)]
    assert first == again and len(set(first)) > 1
    assert len({env.reset(seed=s)[1]["problem_id"] for s in range(8)}) > 1
    other = gym_env(treasure, seed=1)  # another pool seed: other problems
    assert [p.id for p in other.episode.problems] != [p.id for p in env.episode.problems]
    for options, match in (
        ({"problem_index": 100}, r"problem_index must be an int in \[0, 100\)"),
        ({"problem_id": "nope"}, "no problem 'nope' among the 100 train problems of treasure_hunt"),
        ({"problem": 1}, "unknown reset options"),
        ({"problem_index": 0, "problem_id": "x"}, "not both"),
    ):
        with pytest.raises(ValueError, match=match):
            env.reset(options=options)


def test_observations_are_escaped_and_cut_into_the_text_space():
    pytest.importorskip("gymnasium")
    from gymnasium.spaces import Text

    from temper.export.gymnasium_env import CHARSET, fit

    space = Text(40, min_length=0, charset=CHARSET)
    assert fit("caf\u00e9 \u2019ok\u2019", space) == ("caf\\xe9 \\u2019ok\\u2019", 0)
    text, cut = fit("x" * 100, space)
    assert len(text) == 40 and text in space and text.endswith(f"[... {cut} characters cut]")
    assert text.startswith("x" * (40 - len(f"\n[... {cut} characters cut]"))) and cut == 100 - text.count("x")
    assert fit("x" * 40, space) == ("x" * 40, 0)


class Broken:
    """An env task whose env fails on its second step, or hangs there."""

    name, max_turns = "broken", 4

    def __init__(self, hang: bool = False):
        self.hang, self.closed = hang, 0

    def sample(self, split, n, seed):
        from temper.tasks.base import Problem

        return [Problem("broken", split, f"b{i}", "go") for i in range(n)]

    def make_env(self, problem):
        task = self

        class BrokenEnv:
            stop = ()

            def __init__(self):
                self.steps = 0

            def reset(self):
                return [{"role": "system", "content": "rules"}, {"role": "user", "content": "go"}]

            def step(self, action):
                self.steps += 1
                if self.steps == 2:
                    if task.hang:
                        time.sleep(1.0)
                    raise KeyError("the backend went away")
                return StepResult(messages=[{"role": "tool", "name": "probe", "content": "fine"}])

            def close(self):
                task.closed += 1

        return BrokenEnv()

    score = demonstration = corpus_text = None


def test_a_failing_or_hung_env_is_one_line_and_ends_the_episode():
    task = Broken()
    episodes = TaskEpisodes(task)
    first = episodes.start(0)
    assert first.observation == "[system]\nrules\n\ngo"  # roles other than the user's are named
    assert episodes.step("a").observation == "[tool probe]\nfine"
    with pytest.raises(guard.UserCodeFailure, match=r"env BrokenEnv\.step raised on problem b0: KeyError"):
        episodes.step("b")
    assert task.closed == 1 and episodes.env is None
    with pytest.raises(RuntimeError):
        episodes.step("c")

    slow = TaskEpisodes(Broken(hang=True), timeout_s=0.2)
    slow.start(0)
    slow.step("a")
    with pytest.raises(guard.UserCodeFailure, match=r"did not return within 0.2 s on problem b0"):
        slow.step("b")
    time.sleep(1.0)  # the abandoned call ends (the module's thread check)


def test_importing_temper_and_the_shared_core_imports_no_framework():
    code = (
        "import sys, temper, temper.export, temper.export.episode; "
        "print([m for m in ('gymnasium', 'openenv', 'uvicorn', 'fastapi') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src")}
    )
    assert out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------- the OpenEnv server


@pytest.fixture
def served():
    """`served(task, **settings)` -> the URL of the task's OpenEnv server on a free loopback port."""
    pytest.importorskip(
        "openenv.core", reason="openenv-core is not installed (pip install 'temper[openenv]')"
    )
    from temper.export.openenv_server import server

    running = []

    def start(task, **settings):
        s = server(task, port=0, **settings)
        thread = threading.Thread(target=s.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not s.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the export test server did not start")
            time.sleep(0.05)
        running.append((s, thread))
        return f"http://127.0.0.1:{s.servers[0].sockets[0].getsockname()[1]}"

    yield start
    for s, thread in running:
        s.should_exit = True
        thread.join(timeout=10)


def test_code_repair_round_trip_temper_openenv_temper_gives_the_direct_outcome(repair, served):
    from openenv.core import GenericEnvClient

    from temper.envs.adapters.openenv import OpenEnvEnv

    recorded = Recording(repair)
    url = served(recorded, n_problems=3)
    problem = TaskEpisodes(repair, n_problems=3).problems[2]
    commands = repair.commands(problem)
    _, results = direct(repair, problem, commands)

    env = OpenEnvEnv(  # the inbound adapter: the served task is a temper env again
        GenericEnvClient(base_url=url),
        render_observation=lambda observation: observation["text"],
        make_action=lambda text: {"text": text},
        reset_kwargs={"problem_id": problem.id},
    )
    assert env.reset() == [{"role": "user", "content": "fix sol.py"}]
    for command, want in zip(commands, results, strict=True):
        got = env.step(command)
        assert got.messages == want.messages and got.done == want.done
    assert got.score.reward == results[-1].score.reward == 1.0 and got.score.correct
    assert env.closed and len(recorded.envs) == 1 and recorded.envs[0].workspace is None


def test_the_openenv_server_plays_treasure_hunt_with_info_state_and_refusals(treasure, served):
    from openenv.core import GenericEnvClient

    url = served(treasure, split="test", seed=3, outcome=2.0)
    problem = TaskEpisodes(treasure, split="test", seed=3).problems[5]
    path = problem.data["path"]
    _, results = direct(treasure, problem, path)
    client = GenericEnvClient(base_url=url).sync()
    try:
        first = client.reset(problem_index=5, episode_id="e1")
        assert first.observation["text"] == problem.prompt and first.observation["info"]["turn"] == 0
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"move": "up"})  # not a TextAction: refused, the episode goes on
        rewards = [client.step({"text": move}) for move in path]
        assert [r.reward for r in rewards] == pytest.approx(
            [r.reward + (2.0 * r.score.reward if r.done else 0.0) for r in results]
        )
        last = rewards[-1]
        assert last.done and not last.observation["truncated"]
        assert last.observation["info"]["score"] == dataclasses.asdict(results[-1].score)
        state = client.state()
        assert (state["episode_id"], state["step_count"]) == ("e1", len(path))  # a dict: the generic client
        with pytest.raises(RuntimeError, match="reset first"):
            client.step({"text": "up"})
        seeded = [client.reset(seed=11).observation["info"]["problem_id"] for _ in range(2)]
        assert seeded[0] == seeded[1]
    finally:
        client.close()
