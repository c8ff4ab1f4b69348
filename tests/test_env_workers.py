"""Envs played in worker processes (`temper.rollout.env_workers`, `train.workers`): the proxies
answer what the envs answer, failures and hangs read as they do in process (one line, never a
traceback or a hang), a dead worker fails its calls, and a seeded RL run on an env task gives the
same metrics and rollouts with local workers as without."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from fakes import FirstByteTask
from temper import guard
from temper.catalog import make_task
from temper.envs.base import StepResult, make_env
from temper.models.presets import build_preset
from temper.rollout.env_workers import LocalPool, open_pool
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import Sample
from temper.tasks.base import Score
from temper.train.features.async_rollouts import AsyncRollouts
from temper.train.features.workers import Workers
from temper.train.rl import RLConfig, train_rl
from temper.train.rl_config import rl_rules
from test_user_env import released  # noqa: F401  (a fixture)

TIMING = ("time/", "rollout_tokens_per_s", "train_tokens_per_s", "episode/env_seconds")


class CountingEnv:
    """Counts its steps in its own state (which must live in the worker between calls); fails
    or hangs on the action it is told to."""

    stop = ()

    def __init__(self, fail_on: str = "", hang_on: str = ""):
        self.n, self.fail_on, self.hang_on, self.pid = 0, fail_on, hang_on, None

    def reset(self):
        self.pid = os.getpid()
        return [{"role": "user", "content": "count"}]

    def step(self, action):
        self.n += 1
        if self.fail_on and self.fail_on in action:
            raise ValueError(f"bad action {action!r}")
        if self.hang_on and self.hang_on in action:
            time.sleep(2.5)  # past the 1 s limit; short, so no thread outlives the module
        done = self.n >= 2
        return StepResult(
            inline=None if done else " ok", done=done, reward=float(self.n), signals={"pid": self.pid}
        )


class Closes(CountingEnv):
    def cut(self, reason):
        return {"cut": reason}

    def close(self):
        raise RuntimeError("cannot close")


@pytest.fixture
def pool():
    p = LocalPool(2)
    yield p
    p.close()


def test_a_proxy_answers_what_its_env_answers_from_a_worker_process(pool):
    [[a, b], [c]] = pool.place([[CountingEnv(), CountingEnv()], [CountingEnv()]])
    assert a.reset() == [{"role": "user", "content": "count"}]
    first, second = a.step("x"), a.step("y")  # the env's count lives in the worker between calls
    assert (first.reward, first.done, second.reward, second.done) == (1.0, False, 2.0, True)
    assert first.signals["pid"] != os.getpid()
    b.reset(), c.reset()
    assert b.step("x").reward == 1.0  # envs are apart
    assert b.step("x").signals["pid"] == first.signals["pid"]  # a group's envs share a worker
    assert c.step("x").signals["pid"] != first.signals["pid"]  # the next group goes to the next one
    assert a.label == "CountingEnv" and type(a).__name__ == "CountingEnv"


def test_a_failure_in_a_worker_reads_as_it_does_in_process(pool):
    [[remote]] = pool.place([[CountingEnv(fail_on="boom")]])
    local = CountingEnv(fail_on="boom")
    lines = []
    for env in (local, remote):
        env.reset()
        with pytest.raises(Exception) as caught:
            env.step("boom")
        lines.append(guard.raised(caught.value, "env CountingEnv.step").line)
    assert lines[0] == lines[1]
    assert lines[1].startswith(
        "env CountingEnv.step raised: ValueError: bad action 'boom' (at test_env_workers.py:"
    )
    assert "\n" not in lines[1]


class SaysY:
    """Every action is the text "Y"."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids = tokenizer, tokenizer.encode("Y", add_special_tokens=False)

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, stop=(), seed=0):
        return [
            [Sample(list(p), list(self.ids), [-0.5] * len(self.ids), "Y", "eos") for _ in range(n)]
            for p in prompts
        ]

    def sync(self, model):
        pass


def _episodes(envs, tokenizer, step_timeout=60.0):
    return run_episodes(
        SaysY(tokenizer), tokenizer, envs, [0] * len(envs), EpisodeLimits(4, 0, 4, step_timeout)
    )


def test_in_the_agent_loop_errors_hangs_and_close_are_attributed_per_episode(pool, tokenizer):
    envs = [[CountingEnv(), CountingEnv(fail_on="Y"), Closes()], [CountingEnv(hang_on="Y")]]
    t0 = time.perf_counter()
    remote = _episodes(pool.place(envs), tokenizer, step_timeout=1.0)
    assert time.perf_counter() - t0 < 10  # the hung step was abandoned, not waited for
    local = _episodes(
        [[CountingEnv(), CountingEnv(fail_on="Y"), Closes()], [CountingEnv(hang_on="Y")]], tokenizer, 1.0
    )
    said = [[(t.stop_reason, t.error) for t in g] for g in remote]
    assert said == [[(t.stop_reason, t.error) for t in g] for g in local]
    assert [r for r, _ in said[0]] == ["done", "env_error", "env_error"]  # Closes' close raised
    assert said[0][2][1].startswith("env Closes.cut/close raised: RuntimeError: cannot close")
    assert said[1][0][0] == "timeout" and "did not return within 1 s" in said[1][0][1]


def test_every_ended_episode_lets_its_env_go_in_its_worker(pool, tokenizer):
    task = FirstByteTask()
    graded = [[make_env(task, p) for p in task.sample("train", 2, seed=0)]]
    long = [[CountingEnv(), CountingEnv(fail_on="Y")], [Closes()]]  # done, env_error, cut at max_turns 1
    run_episodes(SaysY(tokenizer), tokenizer, pool.place(graded + long), [0, 1, 2], EpisodeLimits(1, 0, 4))
    assert [pool.request(w, "held")[1] for w in range(pool.size)] == [0, 0]


def test_an_env_that_cannot_be_pickled_ends_its_episode_saying_so(pool, tokenizer):
    env = CountingEnv()
    env.lock = __import__("threading").Lock()
    [[t]] = _episodes(pool.place([[env]]), tokenizer)
    assert t.stop_reason == "env_error"
    assert "cannot run in a worker process" in t.error and "train.workers off" in t.error


def test_a_worker_that_dies_fails_its_calls_in_one_line_never_hangs(pool):
    [[env]] = pool.place([[CountingEnv()]])
    env.reset()
    pool._procs[0].kill()
    pool._procs[0].join(5)
    with pytest.raises(guard.RaisedElsewhere, match="worker process 0 exited"):
        env.step("x")


def test_a_graded_task_scores_the_same_in_a_worker(pool):
    task = FirstByteTask()
    problems = task.sample("train", 3, seed=0)
    envs = [[make_env(task, p) for p in problems]]
    [proxies] = pool.place(envs)
    actions, ids = ["a", "b", "c"], [[97], [98], [99]]
    here = type(envs[0][0]).step_batch(envs[0], actions, ids)
    there = type(proxies[0]).step_batch(proxies, actions, ids)
    assert [r.score for r in there] == [r.score for r in here]


class TallyEnv:
    """Three turns; counts the policy's "Y"s in its own state, which must live across turns."""

    stop = ()

    def __init__(self, problem):
        self.problem, self.turns, self.yes = problem, 0, 0

    def reset(self):
        return self.problem.messages()

    def step(self, action):
        self.turns += 1
        self.yes += action == "Y"
        if self.turns < 3:
            return StepResult(inline=" ok", reward=0.1 * self.yes, signals={"yes": self.yes})
        ok = self.yes >= 2
        return StepResult(done=True, score=Score(self.yes / 3, ok, True, {"reason": "tally"}))


class TallyTask(FirstByteTask):
    """An agent task: each problem is a three-turn `TallyEnv` episode."""

    name: str = "tally"

    def make_env(self, problem):
        return TallyEnv(problem)


class CoinSampler(SaysY):
    """Says "Y" or "N" as a pure function of (seed, sample, prompt length): a seeded run's
    episodes are the same whoever steps the envs."""

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, stop=(), seed=0):
        out = []
        for p, s in zip(prompts, seed, strict=True):
            group = []
            for j in range(n):
                text = "Y" if (s * 31 + j * 7 + len(p)) % 3 else "N"
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                group.append(Sample(list(p), ids, [-0.5] * len(ids), text, "eos"))
            out.append(group)
        return out


def _config(**kw) -> RLConfig:
    base = dict(
        steps=2, prompts_per_step=2, group_size=2, max_new_tokens=6, temperature=1.0, lr=3e-3, seed=1,
        progress=False, max_turns=3,
    )  # fmt: skip
    return RLConfig(**(base | kw))


def _rl(tokenizer, out, task, config):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer)
    torch.manual_seed(config.seed)
    sampler = CoinSampler(tokenizer) if isinstance(task, TallyTask) else None
    result = train_rl(model, tokenizer, [task], config, out, sampler=sampler)
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    untimed = [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in result.history]
    return untimed, [{k: v for k, v in r.items() if "seconds" not in k and "time" not in k} for r in rows]


def treasure():
    return make_task("treasure_hunt", train_maps=20, test_maps=10, ood_maps=10)


@pytest.mark.parametrize(
    "task", [TallyTask, treasure, FirstByteTask], ids=["tally", "treasure_hunt", "first_byte"]
)
def test_a_seeded_rl_run_with_local_workers_equals_the_in_process_run(tokenizer, tmp_path, task, monkeypatch):
    placed = []
    place = LocalPool.place
    monkeypatch.setattr(LocalPool, "place", lambda self, envs: placed.append(len(envs)) or place(self, envs))
    here = _rl(tokenizer, tmp_path / "here", task(), _config())
    assert placed == []
    there = _rl(tokenizer, tmp_path / "there", task(), _config(workers=Workers(kind="local", actors=2)))
    assert placed == [2, 2]  # every step's groups were played by the workers
    assert here == there
    assert len(here[1]) == 2 * 2 * 2
    if isinstance(task(), TallyTask):  # an agent task: every episode has its three turns, and they differ
        assert {r["turns"] for r in here[1]} == {3} and len({r["reward"] for r in here[1]}) > 1


def test_the_rules_refuse_with_one_line():
    def errors(**kw):
        return [m for _, m in rl_rules(_config(**kw))]

    assert errors(workers=Workers()) == []
    assert any("address is for ray workers" in m for m in errors(workers=Workers(address="auto")))
    both = errors(workers=Workers(), async_rollouts=AsyncRollouts(max_staleness=1))
    assert any("async_rollouts.worker: thread" in m for m in both)
    assert errors(workers=Workers(), async_rollouts=AsyncRollouts(max_staleness=1, worker="thread")) == []


def test_ray_missing_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    [message] = [m for _, m in rl_rules(_config(workers=Workers(kind="ray")))]
    assert "pip install temper[ray]" in message and "\n" not in message


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown worker kind"):
        open_pool("cluster", 1)


def test_where_envs_run_is_left_out_of_the_stage_hash():
    from temper.stages.markers import stage_settings
    from temper.stages.rl import RLStage

    def settings(**kw):
        return stage_settings(RLStage(kind="rl", tasks=["t"], train=RLConfig(**kw)))

    assert settings(workers=Workers(kind="ray", actors=3)) == settings()
    assert "workers" not in settings()["train"]


@pytest.mark.usefixtures("released")
def test_every_failure_of_a_users_env_reads_the_same_from_a_worker(tmp_path, tokenizer):
    """The user's env file (loaded under a generated module name) played in workers: each way its
    factory or env fails or hangs gives the in-process episode's stop reason and line."""
    from fakes import Script
    from temper.catalog import make_recipe_task
    from test_user_env import CASES, FAILING

    (tmp_path / "fail.py").write_text(FAILING)
    rows = [{"prompt": f"case {i}", "answer": "x", "how": how} for i, how in enumerate(["fine", *CASES])]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"task": "dataset", "data": "rows.jsonl", "env": "fail.py:make_env", "split_column": None}
    t = make_recipe_task("fail", entry | {"test_fraction": 0.01}, base_dir=tmp_path)
    problems = [p for split in ("train", "test") for p in t._splits[split]]
    script = Script(tokenizer, lambda text, j: "Answer: x")
    said = []
    with guard.time_limit(0.3):
        pool = LocalPool(2)
        try:
            for place in (lambda envs: envs, pool.place):
                envs = place([[t.make_env(p)] for p in problems])
                out = run_episodes(
                    script, tokenizer, envs, list(range(len(envs))), EpisodeLimits(step_timeout=0.3)
                )
                said.append([(e.stop_reason, e.error) for [e] in out])
        finally:
            pool.close()
    assert said[0] == said[1]
    assert len({reason for reason, _ in said[0]}) == 3  # done, env_error and timeout all seen
