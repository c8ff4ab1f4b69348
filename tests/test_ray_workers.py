"""Envs played by Ray actors (`train.workers: {kind: ray}`) on a local Ray started with
num_cpus=2: a failure reads as in process, and a seeded RL run on an agent task (the treasure
hunt, several turns an episode) equals the in-process run. Skipped without Ray (`temper[ray]`)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install temper[ray])")

from temper import guard  # noqa: E402
from temper.rollout.env_workers import RayPool  # noqa: E402
from temper.train.features.workers import Workers  # noqa: E402
from test_env_workers import CountingEnv, TallyTask, _config, _rl  # noqa: E402

pytestmark = pytest.mark.slow  # Ray starts in ~10 s


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_an_actor_holds_the_env_and_its_failures_read_as_in_process():
    pool = RayPool(2)
    try:
        [[env]] = pool.place([[CountingEnv(fail_on="boom")]])
        env.reset()
        assert env.step("x").reward == 1.0
        with pytest.raises(guard.RaisedElsewhere) as caught:
            env.step("boom")
        line = guard.raised(caught.value, "env CountingEnv.step").line
        assert line.startswith(
            "env CountingEnv.step raised: ValueError: bad action 'boom' (at test_env_workers.py:"
        )
    finally:
        pool.close()
    assert ray.is_initialized()  # the pool leaves alone the Ray it did not start


def test_a_seeded_agent_rl_run_through_ray_actors_equals_the_in_process_run(tokenizer, tmp_path, monkeypatch):
    placed = []
    place = RayPool.place
    monkeypatch.setattr(RayPool, "place", lambda self, envs: placed.append(len(envs)) or place(self, envs))
    here = _rl(tokenizer, tmp_path / "here", TallyTask(), _config())
    there = _rl(tokenizer, tmp_path / "there", TallyTask(), _config(workers=Workers(kind="ray", actors=2)))
    assert placed == [2, 2]  # both steps' groups were played by the actors
    assert here == there
    assert {r["turns"] for r in there[1]} == {3}  # an agent task: three turns an episode
