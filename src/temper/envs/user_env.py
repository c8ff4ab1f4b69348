"""The user's environment, named in a recipe: a `dataset` task with `env: module:function`.

    support_tickets:
      task: dataset
      data: tickets.jsonl               # rows: the episodes' starting points
      env: my_envs.py:make_env          # make_env(row: dict) -> a temper Env (envs/base.py)
      rewards: [exact_match]            # grades the last assistant turn when the env gives no score
      max_turns: 6

Or a TRL environment class, as `GRPOTrainer(environment_factory=...)` takes it:

    vault:
      task: dataset
      data: vaults.jsonl
      environment_factory: my_envs.py:Vault   # Vault() per episode, reset(**row); public methods = tools
      rewards: [my_rewards.py:opened]         # TRL's signature, called with environments=[...]

the factory is then `TRLEnvironment(Vault, row, reward_funcs=<rewards>, reward_weights=...)`
(`temper.envs.adapters.trl_factory`), so the class's tools reach the prompt.

Each episode calls the factory with its row (when the episode starts: the agent loop runs it with
the env's `reset`, both under the user-code time limit). `reset()` may return the opening
messages, or nothing to use the row's `prompt` column. A factory or env method that raises, hangs
or returns the wrong kind of thing ends its episode as an env_error (or timeout) with one line
naming the factory, the env class and method, the problem and the error (`temper.guard`); the
env's `tools` (a ToolEnv, a TRL environment class) reach the prompt. The outcome is the env's final `StepResult.score`; an
env that ends without one is graded by the task's reward functions on the last assistant turn,
exactly as the single-turn data task grades a completion. Splits, ids and the stage hash are the
data task's (the factory's source is part of the fingerprint, so editing it reruns the stage).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temper import guard
from temper.envs.base import Closable, Cuttable, Env, StepResult, tools_of
from temper.tasks.base import Problem, TaskOptionError
from temper.tasks.dataset_task import DataTask, DataTaskConfig
from temper.tasks.reward_functions import RewardFunction, load_reward_function


class EnvDataTask(DataTask):
    """A data task whose problems are played as episodes of the user's environment."""

    def __init__(self, config: DataTaskConfig, name: str = "dataset", base_dir: Path | None = None):
        super().__init__(config, name, base_dir)
        if config.max_turns < 1:
            raise TaskOptionError(("max_turns",), f"task {name!r}: max_turns must be at least 1")
        if config.env and config.environment_factory:
            raise TaskOptionError(
                ("environment_factory",),
                f"task {name!r}: give env (a factory of temper Envs) or environment_factory (a TRL "
                "environment class), not both",
            )
        key = "env" if config.env else "environment_factory"
        try:
            self.factory = load_reward_function(str(getattr(config, key)), self.base_dir, what=key)
        except ValueError as err:
            raise TaskOptionError((key,), f"task {name!r}: {err}") from None
        if config.environment_factory:
            self.factory = _trl_factory(self.factory, self)
        self.max_turns = config.max_turns

    def make_env(self, problem: Problem) -> Env:
        """The episode's env. The factory is called when the episode starts (its `reset`), so the
        agent loop runs it with the env's other user code: under a time limit, in parallel with
        the other episodes' factories, its failure one line (`temper.guard`)."""
        return _GradedEnv(self, problem)

    def fingerprint(self) -> str:
        h = hashlib.sha256(super().fingerprint().encode())
        h.update(self.factory.name.encode() + self.factory.source.encode())
        return h.hexdigest()[:16]


def _trl_factory(cls: RewardFunction, task: EnvDataTask) -> RewardFunction:
    """The `make_env(row)` a TRL user would otherwise write: `TRLEnvironment(cls, row,
    reward_funcs=<the task's rewards>, ...)`, named and hashed as the class (`temper.envs.adapters`)."""
    from temper.envs.adapters.trl_factory import TRLEnvironment  # (transformers, for the tool schemas)

    def make_env(row: dict[str, Any]) -> TRLEnvironment:
        return TRLEnvironment(
            cls.fn,
            row,
            reward_funcs=task.rewards,
            reward_weights=task.weights,
            correct_threshold=task.config.correct_threshold,
        )

    return RewardFunction(cls.name, make_env, cls.source)


class _GradedEnv:
    """The user's env, made by the factory at `reset`, with the data task's grading as the
    fallback outcome. It passes on what the agent loop reads of an env (`stop` once it is made,
    `tools`, `cut`, `close`) and turns each failure of the user's code into a `UserCodeFailure`
    naming the factory, the env's class and method, and the problem (the loop's time limits then
    apply to it all)."""

    def __init__(self, task: EnvDataTask, problem: Problem):
        self.task, self.problem = task, problem
        self.env: Any = None
        self.stop: Sequence[str] = ()
        self.context = f"problem {problem.id}"

    @property
    def label(self) -> str:
        """What the failure lines call this env: its class and its factory."""
        made = f"{type(self.env).__name__} " if self.env is not None else ""
        return f"{made}(env {self.task.factory.name})"

    def describe(self, method: str) -> str:
        """What a failure's line calls a call of `method` that the agent loop timed: the factory
        while the env is not made yet (a hung factory), else the env's method; on the problem."""
        if self.env is None:
            return f"env factory {self.task.factory.name} on {self.context}"
        return f"env {self.label}.{method} on {self.context}"

    @property
    def tools(self) -> Any:
        """The wrapped env's tool schemas (a ToolEnv's, a TRL environment class's), for the prompt."""
        return tools_of(self.env)

    def reset(self) -> list[dict[str, Any]]:
        name = self.task.factory.name
        try:
            env = self.task.factory.fn(dict(self.problem.data["row"]))
        except Exception as err:
            raise guard.raised(err, f"env factory {name}", self.context) from err
        if not callable(getattr(env, "reset", None)) or not callable(getattr(env, "step", None)):
            raise guard.returned(
                f"env factory {name}",
                f"{type(env).__name__}, not an Env (an object with reset() -> messages and "
                "step(action) -> StepResult)",
                self.context,
            )
        self.env = env
        self.stop = tuple(getattr(env, "stop", ()) or ())
        try:
            messages = env.reset()
        except Exception as err:
            raise guard.raised(err, f"env {self.label}.reset", self.context) from err
        if messages is not None and not _is_chat(messages):
            raise guard.returned(
                f"env {self.label}.reset",
                f"{type(messages).__name__}, not a list of {{role, content}} messages (or None)",
                self.context,
            )
        return list(messages or self.problem.messages())

    def step(self, action: str) -> StepResult:
        try:
            result = self.env.step(action)
        except Exception as err:
            raise guard.raised(err, f"env {self.label}.step", self.context) from err
        if not isinstance(result, StepResult):
            raise guard.returned(
                f"env {self.label}.step", f"{type(result).__name__}, not a StepResult", self.context
            )
        if result.messages and not _is_chat(result.messages):
            raise guard.returned(
                f"env {self.label}.step",
                "StepResult.messages that are not {role, content} messages",
                self.context,
            )
        if result.done and result.score is None:
            result.score = self.task.score(self.problem, action)
        return result

    def cut(self, reason: str) -> dict[str, Any]:
        if not isinstance(self.env, Cuttable):
            return {}
        try:
            return dict(self.env.cut(reason) or {})
        except Exception as err:
            raise guard.raised(err, f"env {self.label}.cut", self.context) from err

    def close(self) -> None:
        if not isinstance(self.env, Closable):
            return
        try:
            self.env.close()
        except Exception as err:
            raise guard.raised(err, f"env {self.label}.close", self.context) from err


def _is_chat(messages: Any) -> bool:
    """A list of {role: str, content: str} messages (a tool call's message may have no content)."""
    return isinstance(messages, list) and all(
        isinstance(m, dict)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content", ""), str | type(None))
        for m in messages
    )
