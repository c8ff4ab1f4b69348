"""An environment seen through a harness: the env's observations rewritten by the harness file.

    env = HarnessEnv(task.make_env(problem), harness, info, problem.id)

`reset`: the env's first observation (its last user turn) becomes `bootstrap(info) +
build_prompt(observation, memory, first=True)`, after the harness's `system` turn when it has
one (in place of the env's own). `step`: the env steps on the model's action as it is; when the
episode goes on, the memory is updated (`update_memory(memory, action, observation)`) and the
observation shown is `build_prompt(observation, memory, first=False)`. Rewards, signals, scores
and `done` are the env's own: a harness changes what the model reads, never how it is graded.
An env turn that does not end with a user message (chat tool results) is shown as the env gave
it. Each harness call is guarded user code (`Harness.call`), so its failure ends the episode as
env_error with a line naming the harness file and function, as the agent loop does for envs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from temper import guard
from temper.envs.base import Closable, Cuttable, Env, StepResult
from temper.harness.file import Harness


def _text(harness: Harness, fn: str, value: Any, context: str) -> str:
    if not isinstance(value, str):
        raise guard.returned(f"harness {harness.name}:{fn}", f"{type(value).__name__}, not a str", context)
    return value


class HarnessEnv:
    """`env` with `harness` between it and the model (module docstring)."""

    def __init__(self, env: Env, harness: Harness, info: dict[str, Any], problem_id: str):
        self.env, self.harness, self.info, self.context = env, harness, info, f"problem {problem_id}"
        self.stop = tuple(getattr(env, "stop", ()))
        self.memory: dict[str, Any] = {}
        # an optional capability is passed on only when the env has it (None counts as absent)
        self.cut = env.cut if isinstance(env, Cuttable) else None
        self.close = env.close if isinstance(env, Closable) else None

    def _call(self, fn: str, *args: Any) -> Any:
        return self.harness.call(
            fn, *args, dict(self.harness.settings), context=self.context
        )  # a copy: never changed

    def reset(self) -> list[dict[str, Any]]:
        messages = [dict(m) for m in self.env.reset()]
        if not messages or messages[-1].get("role") != "user":
            raise ValueError(
                f"a harness rewrites a user observation; {type(self.env).__name__}.reset gave none"
            )
        observation = messages[-1]["content"]
        info = {**self.info, "observation": observation}
        boot = _text(self.harness, "bootstrap", self._call("bootstrap", info), self.context)
        shown = _text(
            self.harness,
            "build_prompt",
            self._call("build_prompt", observation, self.memory, True),
            self.context,
        )
        messages[-1]["content"] = boot + shown
        if self.harness.has("system"):
            system = _text(self.harness, "system", self._call("system"), self.context)
            if system:
                messages = [
                    {"role": "system", "content": system},
                    *(m for m in messages if m["role"] != "system"),
                ]
        return messages

    def step(self, action: str) -> StepResult:
        result = self.env.step(action)
        if result.done or not result.messages or result.messages[-1].get("role") != "user":
            return result
        observation = result.messages[-1]["content"]
        memory = self._call("update_memory", dict(self.memory), action, observation)
        if not isinstance(memory, dict):
            raise guard.returned(
                f"harness {self.harness.name}:update_memory",
                f"{type(memory).__name__}, not a dict",
                self.context,
            )
        self.memory = memory
        shown = _text(
            self.harness,
            "build_prompt",
            self._call("build_prompt", observation, self.memory, False),
            self.context,
        )
        return dataclasses.replace(
            result, messages=[*result.messages[:-1], {"role": "user", "content": shown}]
        )
