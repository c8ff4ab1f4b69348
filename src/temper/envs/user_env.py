"""The user's environment, named in a recipe: a `dataset` task with `env: module:function`.

    support_tickets:
      task: dataset
      data: tickets.jsonl               # rows: the episodes' starting points
      env: my_envs.py:make_env          # make_env(row: dict) -> a temper Env (envs/base.py)
      rewards: [exact_match]            # grades the last assistant turn when the env gives no score
      max_turns: 6

Each episode calls the factory with its row. `reset()` may return the opening messages, or
nothing to use the row's `prompt` column. The outcome is the env's final `StepResult.score`; an
env that ends without one is graded by the task's reward functions on the last assistant turn,
exactly as the single-turn data task grades a completion. Splits, ids and the stage hash are the
data task's (the factory's source is part of the fingerprint, so editing it reruns the stage).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temper.envs.base import Env, StepResult
from temper.tasks.base import Problem, TaskOptionError
from temper.tasks.dataset_task import DataTask, DataTaskConfig
from temper.tasks.reward_functions import load_reward_function


class EnvDataTask(DataTask):
    """A data task whose problems are played as episodes of the user's environment."""

    def __init__(self, config: DataTaskConfig, name: str = "dataset", base_dir: Path | None = None):
        super().__init__(config, name, base_dir)
        if config.max_turns < 1:
            raise TaskOptionError(("max_turns",), f"task {name!r}: max_turns must be at least 1")
        try:
            self.factory = load_reward_function(str(config.env), self.base_dir, what="env")
        except ValueError as err:
            raise TaskOptionError(("env",), f"task {name!r}: {err}") from None
        self.max_turns = config.max_turns

    def make_env(self, problem: Problem) -> Env:
        env = self.factory.fn(dict(problem.data["row"]))
        if not callable(getattr(env, "reset", None)) or not callable(getattr(env, "step", None)):
            raise TypeError(
                f"env factory {self.factory.name!r} returned {type(env).__name__}, not an Env "
                "(an object with reset() -> messages and step(action) -> StepResult)"
            )
        return _GradedEnv(self, problem, env)

    def fingerprint(self) -> str:
        h = hashlib.sha256(super().fingerprint().encode())
        h.update(self.factory.name.encode() + self.factory.source.encode())
        return h.hexdigest()[:16]


class _GradedEnv:
    """The user's env with the data task's grading as the fallback outcome."""

    def __init__(self, task: EnvDataTask, problem: Problem, env: Any):
        self.task, self.problem, self.env = task, problem, env
        self.stop: Sequence[str] = tuple(getattr(env, "stop", ()) or ())

    def reset(self) -> list[dict[str, Any]]:
        return list(self.env.reset() or self.problem.messages())

    def step(self, action: str) -> StepResult:
        result = self.env.step(action)
        if not isinstance(result, StepResult):
            raise TypeError(
                f"env {type(self.env).__name__}.step returned {type(result).__name__}, not a StepResult"
            )
        if result.done and result.score is None:
            result.score = self.task.score(self.problem, action)
        return result

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()
