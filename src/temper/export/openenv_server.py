"""Any temper task served as an OpenEnv environment (`pip install 'temper[openenv]'`).

    serve("code_repair", options={"test_tasks": 10}, split="test", port=8000)   # blocks (uvicorn)

    client = GenericEnvClient(base_url="http://127.0.0.1:8000").sync()         # any OpenEnv client
    result = client.reset(problem_index=3)      # or problem_id="test3", or seed=7 (a seeded draw)
    result = client.step({"text": "run_tests"})
    result.observation["text"], result.reward, result.done, result.observation["info"]

OpenEnv (`openenv-core`) serves an `Environment` subclass through `create_app` (FastAPI): each
WebSocket session gets its own instance from the factory, closed when the session ends. Here that
instance is a `TaskEnvironment`, holding one temper env at a time (`temper.export.episode`, which
says what an episode, the observation text, the reward and `info` are; the same as the gymnasium
env's):

- action `TextAction(text)`: the policy's text for one step (any other shape is refused by the
  server's schema, VALIDATION_ERROR, and the episode goes on);
- observation `TaskObservation`: `text`, `reward` (the weighted step reward, the outcome added on
  the last step), `done` (terminated or truncated), `truncated`, and `info` (the episode's info;
  OpenEnv's own `metadata` never reaches a client: its serializer drops it);
- `reset(seed=, episode_id=, problem_index=, problem_id=)`: a new temper env, the last one closed;
  without an index or id the problem is drawn with `random.Random(seed)`, or, without a seed, the
  session's generator (seeded by the server's `seed`), so seeded resets replay;
- `state`: `episode_id`, `step_count`, `problem_id`, `split`;
- a step before reset or after the end, or a failing env (one line: `temper.guard`), is the
  server's EXECUTION_ERROR; the stateless HTTP `/step` (a fresh instance per request, never reset)
  therefore always is: play episodes over the WebSocket session, as OpenEnv's clients do.

Sessions: every instance has its own temper env and workspace, so `SUPPORTS_CONCURRENT_SESSIONS`;
`max_sessions` (default 4) bounds them. The task is built once per server and shared: a temper
task is a configuration and a problem generator, its per-episode state lives in the env.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from temper.export.episode import TaskEpisodes, Turn, resolve
from temper.tasks.base import Task


class TextAction(Action):
    """One step's action: the policy's text."""

    text: str = Field(description="the policy's text for this step (its assistant turn)")


class TaskObservation(Observation):
    """A reset's or a step's observation (module docstring)."""

    text: str = Field(default="", description="the new turns as text (temper.export.episode.render)")
    truncated: bool = Field(default=False, description="ended at max_turns without the env's done")
    info: dict[str, Any] = Field(default_factory=dict, description="problem, turn, messages, signals, score")


class TaskEnvironment(Environment):
    """A temper task's episodes for one OpenEnv session (module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, task: Task, split: str = "train", seed: int = 0, **episode: Any):
        """episode: `TaskEpisodes`' keywords (n_problems, max_turns, process, outcome, timeout_s)."""
        super().__init__()
        self.episodes = TaskEpisodes(task, split, seed, **episode)
        self.rng = random.Random(seed)
        self._state = State(step_count=0)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        problem_index: int | None = None,
        problem_id: str | None = None,
        **kwargs: Any,
    ) -> TaskObservation:
        if seed is not None:
            self.rng = random.Random(seed)
        chosen = {"problem_index": problem_index, "problem_id": problem_id}
        options = {k: v for k, v in chosen.items() if v is not None}
        index = self.episodes.select(options, self.rng.randrange)
        turn = self.episodes.start(index)
        problem = self.episodes.problems[index]
        self._state = State(
            episode_id=episode_id, step_count=0, problem_id=problem.id, split=self.episodes.split
        )
        return _observation(turn)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TaskObservation:
        turn = self.episodes.step(action.text)
        self._state.step_count += 1
        return _observation(turn)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.episodes.close()


def _observation(turn: Turn) -> TaskObservation:
    return TaskObservation(
        text=turn.observation,
        reward=turn.reward,
        done=turn.terminated or turn.truncated,
        truncated=turn.truncated,
        info=turn.info,
    )


def app(
    task: Task | str,
    *,
    options: Mapping[str, Any] | None = None,
    split: str = "train",
    seed: int = 0,
    max_sessions: int = 4,
    **episode: Any,
) -> Any:
    """The FastAPI app serving `task` (a Task, or a catalog name built with `options`)."""
    built = resolve(task, options)
    factory = functools.partial(TaskEnvironment, built, split, seed, **episode)
    return create_app(
        factory,
        TextAction,
        TaskObservation,
        env_name=f"temper-{built.name}",
        max_concurrent_envs=max_sessions,
    )


def server(task: Task | str, host: str = "127.0.0.1", port: int = 8000, **settings: Any) -> Any:
    """A `uvicorn.Server` for `app(task, **settings)` on host:port (port 0: a free one), not started."""
    import uvicorn

    config = uvicorn.Config(app(task, **settings), host=host, port=port, log_level="warning")
    return uvicorn.Server(config)


def serve(task: Task | str, host: str = "127.0.0.1", port: int = 8000, **settings: Any) -> None:
    """Serve `task` on host:port until interrupted (loopback by default: the envs run code)."""
    server(task, host, port, **settings).run()
