"""One temper episode driven from outside temper: what the gymnasium env and the OpenEnv server share.

    episodes = TaskEpisodes(make_task("code_repair"), split="train", seed=0)
    first = episodes.start(episodes.select({"problem_index": 3}, draw))   # Turn: the prompt as text
    turn = episodes.step("run_tests")       # Turn(observation, reward, terminated, truncated, info)
    episodes.close()                        # the temper env's sandbox workspace is removed

Any task works: an environment task through its `make_env(problem)`, a single-turn task as a
one-step episode (`temper.envs.base.make_env`'s `TaskEnv`). Each adapter only turns a `Turn` into
its framework's types.

Problems: a pool of `n_problems` drawn once, on first use, as `task.sample(split, n_problems, seed)`
(train with repeats, held-out splits without, at most all of them), so two adapters with the same
(task, split, seed) see the same problems. An episode plays the pool's `problem_index`, the problem
with `problem_id`, or, with neither, the index the adapter draws (its seeded generator).

Observation text (`render`): each new message's content, a blank line between two; a turn that is
not the user's is headed by its role in brackets, a tool result by its name too (`[system]`,
`[tool guess]`), so the common case, one user observation, is exactly the text the policy reads in
temper. Inline text (`StepResult.inline`, an answer inside the policy's own turn) is the
observation as is, with `info["inline"]`; an env that rewrote the conversation (`history`) gives
the whole of it, with `info["history"]`. The raw messages are always in `info["messages"]`, for a
caller that renders them with its own chat template.

Reward of a step: `process x StepResult.reward + outcome x Score.reward`, the second term only on the
step that ends the episode with a score (the weights are the recipe's `process` and `outcome`
reward components; default 1 and 1: a code_repair episode returns its outcome, a treasure hunt its
shaping plus the treasure). An env whose Score already sums its step rewards (temper's inbound
gymnasium and OpenEnv adapters: Score.reward is their return) would count them twice: give it
`outcome=0` or `process=0`. Both parts are in `info` unweighted (`process_reward`,
`outcome_reward`), so a caller can weight them its own way.

Ends: `terminated` when the env says done (its own limits included: code_repair's last command);
`truncated` after `max_turns` actions without done (default: the task's own `max_turns`, else
evaluate's 8), the env then `cut("max_turns")` as the agent loop does (its still-verifiable end
signals join the last step's) and no score. Either way the env is closed at once, so its sandbox
never outlives the episode; a new `start` or `close` closes a live one.

Info: `problem_id`, `problem_index`, `split`, `turn` (actions so far), `messages`; at reset also
`stop` (the strings at which sampling should pause for the env) and `tools` (the JSON schemas the
env offers, None for none); after a step `signals`, `process_reward`, and on the last step `score` (reward,
correct, parsed, details; None when truncated) and `outcome_reward`.

Failures: every call of the temper env (`make_env`, `reset`, `step`, `cut`, `close`) runs as user
code (`temper.guard.call`, under its time limit), so a hung or failing env raises a
`UserCodeFailure` whose one line names the env, the problem and the error; the episode is then
over (its state is unknown) and closed. Stepping an episode that has not started, or is over, is
the caller's bug: RuntimeError.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from temper import guard
from temper.catalog import make_task
from temper.envs.base import (
    Closable,
    Cuttable,
    DescribesCalls,
    Env,
    Labelled,
    StepResult,
    TurnLimited,
    make_env,
    tools_of,
)
from temper.tasks.base import Problem, Task

DEFAULT_MAX_TURNS = 8
"""Actions per episode for a task without its own `max_turns` (evaluate's default)."""
OPTIONS = ("problem_index", "problem_id")
"""The reset options that choose a problem."""


def resolve(task: Task | str, options: Mapping[str, Any] | None = None) -> Task:
    """A task object, or the catalog's task of that name built with `options` (its config's fields)."""
    if isinstance(task, str):
        return make_task(task, **dict(options or {}))
    if options:
        raise ValueError("task options go with a task named by its catalog name, not a built task")
    return task


def render(messages: list[dict[str, Any]]) -> str:
    """The observation text of new chat turns (module docstring)."""
    parts = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        role = m.get("role", "user")
        if role != "user":
            name = m.get("name")
            text = f"[{role}{f' {name}' if name else ''}]\n{text}"
        parts.append(text)
    return "\n\n".join(parts)


@dataclass
class Turn:
    """What one reset or step gives the caller."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def _what(env: Any, method: str) -> str:
    """What a failure's line calls `env.<method>` (as the agent loop says it)."""
    if isinstance(env, DescribesCalls) and callable(env.describe):
        return env.describe(method)
    label = (env.label if isinstance(env, Labelled) else None) or type(env).__name__
    return f"env {label}.{method}"


class TaskEpisodes:
    """A task's episodes, one at a time (module docstring); `env` is the live temper env, if any."""

    def __init__(
        self,
        task: Task,
        split: str = "train",
        seed: int = 0,
        *,
        n_problems: int = 100,
        max_turns: int | None = None,
        process: float = 1.0,
        outcome: float = 1.0,
        timeout_s: float | None = None,
    ):
        if n_problems < 1:
            raise ValueError(f"n_problems must be >= 1, got {n_problems}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.task, self.split, self.seed, self.n_problems = task, split, seed, n_problems
        own = task.max_turns if isinstance(task, TurnLimited) else DEFAULT_MAX_TURNS
        self.max_turns = max_turns or own
        self.process, self.outcome, self.timeout_s = process, outcome, timeout_s
        self._pool: list[Problem] | None = None
        self.env: Env | None = None
        self.problem: Problem | None = None
        self.index = -1
        self.turn = 0

    @property
    def problems(self) -> list[Problem]:
        """The pool (module docstring), drawn on first use."""
        if self._pool is None:
            self._pool = list(self.task.sample(self.split, self.n_problems, self.seed))
            if not self._pool:
                raise ValueError(f"task {self.task.name!r} has no {self.split} problems")
        return self._pool

    def select(self, options: Mapping[str, Any], draw: Callable[[int], int]) -> int:
        """The pool index an episode plays: `options["problem_index"]`, the index of
        `options["problem_id"]`, else `draw(len(pool))`."""
        if bad := sorted(set(options) - set(OPTIONS)):
            raise ValueError(f"unknown reset options {bad}; valid: {', '.join(OPTIONS)}")
        if "problem_index" in options and "problem_id" in options:
            raise ValueError("give problem_index or problem_id, not both")
        pool = self.problems
        where = f"the {len(pool)} {self.split} problems of {self.task.name} (seed {self.seed})"
        if "problem_id" in options:
            ids = [p.id for p in pool]
            if options["problem_id"] not in ids:
                shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
                raise ValueError(f"no problem {options['problem_id']!r} among {where}: {shown}")
            return ids.index(options["problem_id"])
        if "problem_index" in options:
            index = options["problem_index"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(pool):
                raise ValueError(
                    f"problem_index must be an int in [0, {len(pool)}) for {where}, got {index!r}"
                )
            return index
        return int(draw(len(pool)))

    def start(self, index: int) -> Turn:
        """A fresh episode on the pool's problem `index` (a live one is closed first)."""
        self.close()
        self.problem, self.index, self.turn = self.problems[index], index, 0
        env = make_env(self.task, self.problem)  # never raises: a failed factory's env raises at reset
        self.env = env
        messages = self._call(env, "reset")
        info = self._info(messages) | {"stop": list(env.stop), "tools": copy.deepcopy(tools_of(env))}
        return Turn(render(messages), 0.0, False, False, info)

    def step(self, action: str) -> Turn:
        """Play one action (module docstring)."""
        env = self.env
        if env is None:
            raise RuntimeError("no live episode: reset first (an episode that ended needs a new reset)")
        self.turn += 1
        result: StepResult = self._call(env, "step", action)
        messages, extra = result.messages, {}
        observation = None
        if result.inline is not None:
            observation, extra = result.inline, {"inline": True}
        elif result.history is not None:
            messages, extra = result.history, {"history": True}
        signals = copy.deepcopy(result.signals)
        truncated = not result.done and self.turn >= self.max_turns
        if truncated and isinstance(env, Cuttable):
            signals |= self._call(env, "cut", "max_turns") or {}
        reward = self.process * float(result.reward)
        info = self._info(messages) | extra | {"signals": signals, "process_reward": float(result.reward)}
        if result.done or truncated:
            score = result.score if result.done else None
            info["score"] = None if score is None else copy.deepcopy(asdict(score))
            info["outcome_reward"] = None if score is None else float(score.reward)
            if score is not None:
                reward += self.outcome * float(score.reward)
            self.close()
        text = render(messages) if observation is None else observation
        return Turn(text, reward, bool(result.done), truncated, info)

    def close(self) -> None:
        """Close the live env, if any (idempotent)."""
        env, self.env = self.env, None
        if isinstance(env, Closable):
            self._call(env, "close", closing=True)

    def _call(self, env: Env, method: str, *args: Any, closing: bool = False) -> Any:
        context = f"problem {self.problem.id}" if self.problem is not None else ""
        try:
            return guard.call(
                getattr(env, method), *args, what=_what(env, method), context=context, timeout=self.timeout_s
            )
        except guard.UserCodeFailure:
            if not closing:  # the env's state is unknown: the episode is over
                self.close()
            raise

    def _info(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        assert self.problem is not None
        return {
            "problem_id": self.problem.id,
            "problem_index": self.index,
            "split": self.split,
            "turn": self.turn,
            "messages": copy.deepcopy(list(messages)),
        }
