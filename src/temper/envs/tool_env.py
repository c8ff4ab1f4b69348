"""`ToolEnv`: an episode in which the policy may call the user's tools (chat tool calls in the
Hugging Face convention, `temper.tools.calls`) before it answers.

    registry = ToolRegistry([add, lookup])
    env = ToolEnv(problem.messages(), registry, grader=lambda answer: task.score(problem, answer))
    # or, for a Task's problem: ToolEnv.for_task(task, problem, registry)
    messages = env.reset()                    # rendered with tools=env.tools (below)
    env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
        # -> StepResult(messages=[{"role": "tool", "name": "add", "content": "5"}],
        #               signals={"tool_calls": 1, "tool_errors": 0})
    env.step("The answer is 5.")              # no tool call: the answer, graded; done

Each assistant turn is parsed for `<tool_call>` blocks. With calls, each is run (or refused with
a readable `Error: ...`) and answered by a `tool` message, appended after the assistant turn; the
episode goes on. Without one the turn is the final answer: the grader scores it and the episode
ends. Signals on every step: `tool_calls` (tool messages sent back) and `tool_errors` (how many of
them report an error: malformed call, unknown tool, bad arguments, the tool raising).

The tools reach the prompt through the chat template, as in `transformers`: whoever renders this
env's conversation passes `tools=env.tools` to `apply_chat_template` (`temper.data.chat.prompt_ids`
takes `tools=`); an `Env` without tools has no `tools` attribute, so a renderer uses
`getattr(env, "tools", None)`. The template must render tools and tool calls (the built-in
`temper` and `chatml` templates and most hub templates do); `temper.data.chat.check_tool_template`
refuses one that does not, such as the built-in template of a tokenizer saved before tool support.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from temper.envs.base import StepResult
from temper.tasks.base import Problem, Score, Task, grade, verifier_error
from temper.tools.calls import ToolRegistry, parse_tool_calls


class ToolEnv:
    """One episode over a conversation, a tool registry and a grader of the final answer.

    grader: the final answer's text -> its `Score` (an exception in it is recorded as a
        verifier error, as `tasks.base.grade` records one, never a silent zero)."""

    stop: Sequence[str] = ()  # a tool call ends the assistant turn, as in the chat convention

    def __init__(
        self,
        messages: list[dict[str, Any]],
        registry: ToolRegistry,
        grader: Callable[[str], Score],
    ):
        self.messages, self.registry, self.grader = messages, registry, grader

    @classmethod
    def for_task(cls, task: Task, problem: Problem, registry: ToolRegistry) -> ToolEnv:
        """The env of a task's problem, graded by the task's verifier: a task's `make_env` is
        `return ToolEnv.for_task(self, problem, REGISTRY)`."""
        return cls(problem.messages(), registry, lambda answer: grade(task, problem, answer))

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The JSON schemas for `apply_chat_template(..., tools=)`."""
        return self.registry.schemas

    def reset(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.messages]

    def step(self, action: str) -> StepResult:
        calls = parse_tool_calls(action)
        if isinstance(calls, list) and not calls:
            try:
                score = self.grader(action)
            except Exception as err:  # a grader bug is an infrastructure error, counted apart
                score = verifier_error(err)
            return StepResult(done=True, score=score, signals={"tool_calls": 0, "tool_errors": 0})
        results = [self.registry.run(c) for c in (calls if isinstance(calls, list) else [calls])]
        signals = {"tool_calls": len(results), "tool_errors": sum(r.error is not None for r in results)}
        return StepResult(messages=[r.message for r in results], signals=signals)
