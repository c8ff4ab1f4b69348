"""A TRL `environment_factory` class as a temper `Env`, unchanged: its public methods are tools.

TRL 1.16's `GRPOTrainer(environment_factory=Factory)` (read in trl/trainer/grpo_trainer.py):
`Factory()` makes an instance (no arguments); each rollout calls `instance.reset(**row)` with the
data set row (every column, `prompt` included), and a returned string is appended to the last
user message of the row's prompt; every public method other than `reset` and `get_reward` is a
tool (its schema from its type hints and Google-style docstring, `transformers.get_json_schema`);
a tool's return value comes back as `{"role": "tool", "name": ..., "content": str(result)}` and an
exception as the content `str({"error": str(err)})`; a `get_reward()` method, when the class has
one, is an extra reward source of weight 1; reward functions get the instances as
`environments=[...]`.

    env = TRLEnvironment(Vault, {"prompt": [{"role": "user", "content": "Open the vault."}], "secret": 37},
                         reward_funcs=[solved])
    messages = env.reset()         # the row's prompt (+ what reset returned); env.tools: JSON schemas
    env.step('<tool_call>{"name": "guess", "arguments": {"number": 50}}</tool_call>')
        # -> StepResult(messages=[{"role": "tool", "name": "guess", "content": "lower"}])
    env.step("The code is 37.")    # no tool call: the final answer, graded -> done, score

Tool calls are read from the assistant's text in the Hermes / Qwen2.5 format,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn allowed, each answered
by one tool message in order. A malformed call (bad JSON, no name, an unknown tool, arguments the
method's signature rejects) is answered with an error the model can read, like TRL's; it marks the
episode `parsed=False` and counts as `tool_errors`, as does a tool that raises (TRL's
`tool_failure_count`); a raising tool leaves `parsed` alone, it is the tool's answer.

The turn without a tool call ends the episode; it is graded by `reward_funcs` (TRL's signature,
called as temper.tasks.reward_functions.call_all calls a data task's) plus the instance's
`get_reward`: reward = the weighted sum (None counts 0, as TRL's nansum), correct = the first
source >= `correct_threshold`, parsed = no malformed tool call. `completions` holds the whole
episode after the prompt, as TRL passes it in tool mode: each assistant turn (its raw text, where
TRL has parsed `tool_calls` out of it) and each tool message.

The agent loop renders the prompt with `apply_chat_template(messages, tools=env.tools)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temper.envs.base import StepResult
from temper.tasks.base import Score, verifier_error
from temper.tasks.reward_functions import RewardFunction, call_all, load_reward_function
from temper.tools.calls import ToolCallError, parse_each_tool_call


def _parse_tool_calls(text: str) -> list[dict[str, Any] | str]:
    """Each `<tool_call>` block of `text` as {"name", "arguments"}, or as the error message saying
    why it is not one (temper.tools.calls reads the blocks; each call is answered on its own, as TRL does)."""
    return [
        c.message if isinstance(c, ToolCallError) else {"name": c.name, "arguments": c.arguments}
        for c in parse_each_tool_call(text)
    ]


def tool_methods(instance: Any) -> dict[str, Callable[..., Any]]:
    """The tools of an environment instance, as TRL picks them: the functions defined on its class
    (not properties, which `getmembers` on the instance would evaluate) that are public and are not
    `reset` or `get_reward`, bound to the instance."""
    return {
        name: getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }


class TRLEnvironment:
    """One episode of a TRL environment class on one data set row."""

    stop: Sequence[str] = ()

    def __init__(
        self,
        factory: Callable[[], Any],
        row: dict[str, Any],
        *,
        reward_funcs: Sequence[Callable[..., Any] | RewardFunction | str] = (),
        reward_weights: Sequence[float] | None = None,
        correct_threshold: float = 1.0,
        base_dir: Path | None = None,
    ):
        from transformers.utils import get_json_schema  # transformers' schema, as TRL renders tools

        self.instance = factory()
        if not callable(getattr(self.instance, "reset", None)):
            raise ValueError("an environment_factory class must define a callable `reset` (TRL's rule)")
        self.row = dict(row)
        self.methods = tool_methods(self.instance)
        self.tools = []
        for name, method in self.methods.items():
            try:
                self.tools.append(get_json_schema(method))
            except Exception as err:  # transformers' own error names the missing docstring or hint
                raise ValueError(f"tool {name!r} of {type(self.instance).__name__}: {err}") from err
        self.rewards = [_as_reward(f, base_dir) for f in reward_funcs]
        self.weights = (
            [1.0] * len(self.rewards) if reward_weights is None else [float(w) for w in reward_weights]
        )
        if len(self.weights) != len(self.rewards):
            raise ValueError(f"{len(self.rewards)} reward functions but {len(self.weights)} weights")
        if callable(getattr(self.instance, "get_reward", None)):  # TRL: an extra source of weight 1
            self.rewards.append(_env_reward(type(self.instance).__name__, self.instance.get_reward))
            self.weights.append(1.0)
        if not self.rewards:
            raise ValueError("no reward source: give reward_funcs, or an environment class with get_reward()")
        self.correct_threshold = correct_threshold
        self.prompt: list[dict[str, Any]] = []
        self.episode: list[dict[str, Any]] = []
        self.tool_calls = self.tool_errors = self.malformed = 0
        self.done = False

    def reset(self) -> list[dict[str, Any]]:
        prompt = self.row.get("prompt", [{"role": "user", "content": ""}])  # TRL's default without one
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        observation = self.instance.reset(**self.row)
        if observation is not None:  # TRL appends it to the last user message, leaving the row untouched
            last = prompt[-1]
            prompt = [*prompt[:-1], {**last, "content": f"{last['content']}{observation}"}]
        self.prompt = [dict(m) for m in prompt]
        return [dict(m) for m in self.prompt]

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("step after the episode ended")
        self.episode.append({"role": "assistant", "content": action})
        calls = _parse_tool_calls(action)
        if not calls:
            self.done = True
            signals = {"tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": self.malformed}
            return StepResult(done=True, signals=signals, score=self._grade(action))
        messages, errors = [], 0
        for call in calls:
            name, content, status = self._call(call)
            errors += status != "ok"
            self.malformed += status == "malformed"
            messages.append({"role": "tool", "name": name, "content": content})
        self.tool_calls += len(calls)
        self.tool_errors += errors
        self.episode.extend(messages)
        signals = {"tool_calls": len(calls), "tool_errors": errors, "malformed_tool_calls": self.malformed}
        return StepResult(messages=messages, signals=signals)

    def _call(self, call: dict[str, Any] | str) -> tuple[str, str, str]:
        """(tool name, the tool message's content, status: ok, error (the tool raised) or malformed)."""
        if isinstance(call, str):
            return "unknown", str({"error": call}), "malformed"
        name, arguments = call["name"], call["arguments"]
        method = self.methods.get(name)
        if method is None:  # TRL's message
            return name, str({"error": f"Tool {name} not found."}), "malformed"
        try:
            inspect.signature(method).bind(**arguments)
        except TypeError as err:
            return name, str({"error": f"{name}: {err}"}), "malformed"
        try:
            result = method(**arguments)
        except Exception as err:  # the tool's answer to a bad call, which the model reads
            return name, str({"error": str(err)}), "error"
        return name, str(result), "ok"

    def _grade(self, final: str) -> Score:
        columns = {k: v for k, v in self.row.items() if k != "prompt"}
        columns["environments"] = self.instance  # TRL passes the live instances as `environments`
        outcome = call_all(self.rewards, [self.prompt], [final], None, [columns], completions=[self.episode])
        if outcome.errors[0] is not None:
            return verifier_error(outcome.errors[0])
        values = [v[0] for v in outcome.values]
        total = sum(w * v for w, v in zip(self.weights, values, strict=True) if v is not None)
        correct = values[0] is not None and values[0] >= self.correct_threshold
        parsed = self.malformed == 0
        details = {
            "reason": "correct" if correct else "wrong" if parsed else "malformed_tool_call",
            "answer": final,
            "rewards": {f.name: v for f, v in zip(self.rewards, values, strict=True)},
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
        }
        return Score(float(total), correct, parsed, details)


def _as_reward(fn: Callable[..., Any] | RewardFunction | str, base_dir: Path | None) -> RewardFunction:
    if isinstance(fn, RewardFunction):
        return fn
    if isinstance(fn, str):
        return load_reward_function(fn, base_dir)
    return RewardFunction(getattr(fn, "__name__", repr(fn)), fn)


def _env_reward(name: str, get_reward: Callable[[], Any]) -> RewardFunction:
    """The instance's `get_reward` in TRL's reward signature (awaited when it is async)."""
    if inspect.iscoroutinefunction(get_reward):

        async def reward_async(environments: Sequence[Any] = (), **_: Any) -> list[Any]:
            return [await e.get_reward() for e in environments]

        return RewardFunction(name, reward_async)

    def reward(environments: Sequence[Any] = (), **_: Any) -> list[Any]:
        return [e.get_reward() for e in environments]

    return RewardFunction(name, reward)
