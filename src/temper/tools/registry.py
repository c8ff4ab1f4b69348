"""A tool registry with costs and dependencies (AWorld-style multi-tool environments): each tool
has a declared `cost` per call and the tools it `requires`, those whose output it needs as input.

    registry = CostRegistry()

    @registry.tool(cost=0.02)
    def rate(src: str, dst: str) -> str: ...

    @registry.tool(cost=0.02, requires=["rate"])      # needs a rate id that only `rate` gives
    def convert(amount: int, rate_id: str) -> int: ...

    registry.add(mcp.tools(), costs={"search": 0.1})  # an MCP server's tools (temper.tools.mcp)
    episode = registry.episode()                      # one per env episode: what has been called
    messages, signals = episode.step(assistant_text)  # tool messages, and the step's signals

Tools are `temper.tools.calls.Tool`s (a function and its JSON schema, in the HF convention), so a
local function and an MCP server's tool are called, validated and answered the same way.

Rules, per call (in the order of the turn):
- a malformed call or an unknown tool name is an error observation and costs nothing (nothing was
  requested of any tool);
- a call that names a registered tool pays its `cost`, whatever comes of it (bad arguments, a
  broken dependency or the tool failing included): the turn was spent asking;
- bad arguments (checked against the schema) are an error observation;
- a dependency is satisfied when every tool in `requires` has succeeded in an EARLIER turn of the
  episode: a call in the same turn does not count, since the model wrote both calls before it saw
  the output the second one needs. A call with an unmet dependency is not run: it is an error
  observation naming the tools to call first, and a `dependency_violation` signal (a rule
  verifiably broken); a call of a tool with dependencies that are all met is counted as
  `dependency_respected` (its paired compliance signal, RLVP's third principle);
- the tool runs; its exception is an error observation (`tool 'x' failed: <message>`), except
  `ToolServerError`: the tool's server died or timed out, an infrastructure failure that is
  raised so the episode ends as env_error, never as a zero reward.

Signals per step: tool_calls, tool_errors, tool_cost (the step's summed cost), dependency_violation,
dependency_respected. The step's process reward is `-tool_cost` (the env's `StepResult.reward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from temper.tools.calls import (
    MAX_ERROR_CHARS,
    MAX_OUTPUT_CHARS,
    Tool,
    ToolCall,
    ToolCallError,
    ToolDefinitionError,
    as_text,
    check_arguments,
    clip_text,
    parse_tool_calls,
)

PATH_SIGNALS = {"dependency_violation": "violation", "dependency_respected": "compliance"}
"""The path signals (issue 10's `path_signals` contract) a `CostRegistry` episode emits."""


class ToolServerError(RuntimeError):
    """A tool's backend failed (an MCP server exited, timed out or broke the protocol): an
    infrastructure error, raised through the env's `step` so the episode ends as env_error."""


class ToolFailed(Exception):
    """A tool reports that it failed, with a message for the model (an MCP tool's `is_error`)."""


@dataclass(frozen=True)
class CostedTool:
    """A tool, its cost per call and the tools whose output it needs (`requires`)."""

    tool: Tool
    cost: float = 0.0
    requires: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.tool.name


@dataclass(frozen=True)
class CallOutcome:
    """One call's tool message, its error (None: success), cost, and the unmet dependencies."""

    message: dict[str, Any]
    error: str | None = None
    cost: float = 0.0
    missing: tuple[str, ...] = ()
    respected: bool = False


class CostRegistry:
    """Tools by name with costs and dependencies; `episode()` gives one episode's caller."""

    def __init__(
        self,
        tools: Iterable[CostedTool] = (),
        max_output_chars: int = MAX_OUTPUT_CHARS,
        max_error_chars: int = MAX_ERROR_CHARS,
    ):
        self.tools: dict[str, CostedTool] = {}
        self.max_output_chars, self.max_error_chars = max_output_chars, max_error_chars
        for t in tools:
            self._register(t)
        self.check()

    def _register(self, t: CostedTool) -> None:
        if t.name in self.tools:
            raise ToolDefinitionError(f"two tools are named {t.name!r}")
        if not t.cost >= 0:  # NaN too
            raise ToolDefinitionError(f"tool {t.name!r}: cost must be >= 0, got {t.cost}")
        self.tools[t.name] = t

    def add(
        self,
        tools: Iterable[Tool | Callable[..., Any]],
        costs: Mapping[str, float] | None = None,
        requires: Mapping[str, Iterable[str]] | None = None,
    ) -> CostRegistry:
        """Register functions or `Tool`s (an MCP server's included), with costs and dependencies
        by tool name (0 and none where not given). A name in `costs` or `requires` that is not
        among the tools is an error: a typo would silently make a tool free."""
        tools = [t if isinstance(t, Tool) else Tool.from_function(t) for t in tools]
        names = {t.name for t in tools}
        for what, table in (("costs", costs), ("requires", requires)):
            unknown = sorted(set(table or {}) - names)
            if unknown:
                raise ToolDefinitionError(f"{what} names no such tool: {', '.join(unknown)}")
        for t in tools:
            needs = tuple((requires or {}).get(t.name, ()))
            self._register(CostedTool(t, float((costs or {}).get(t.name, 0.0)), needs))
        self.check()
        return self

    def tool(self, cost: float = 0.0, requires: Iterable[str] = ()) -> Callable[[Callable], Callable]:
        """Decorator: register a typed, documented function as a tool (its dependencies may be
        registered later; `check` runs when an episode starts)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._register(CostedTool(Tool.from_function(fn), float(cost), tuple(requires)))
            return fn

        return register

    def check(self) -> None:
        """Refuse a dependency on an unregistered tool and a cycle (its tools could never run)."""
        for t in self.tools.values():
            for r in t.requires:
                if r not in self.tools:
                    raise ToolDefinitionError(f"tool {t.name!r} requires {r!r}, which is not registered")
        done: set[str] = set()
        for start in self.tools:
            path: list[str] = []
            self._visit(start, path, done)

    def _visit(self, name: str, path: list[str], done: set[str]) -> None:
        if name in done:
            return
        if name in path:
            cycle = " -> ".join(path[path.index(name) :] + [name])
            raise ToolDefinitionError(f"tool dependencies form a cycle: {cycle}")
        path.append(name)
        for r in self.tools[name].requires:
            self._visit(r, path, done)
        path.pop()
        done.add(name)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """What `apply_chat_template(..., tools=)` takes."""
        return [t.tool.schema for t in self.tools.values()]

    def episode(self) -> ToolEpisode:
        self.check()
        return ToolEpisode(self)


@dataclass
class ToolEpisode:
    """The tool calls of one episode: which tools have succeeded (for dependencies) and the cost."""

    registry: CostRegistry
    succeeded: set[str] = field(default_factory=set)
    total_cost: float = 0.0

    def step(self, text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The tool messages answering an assistant turn's calls ([] when it has none), and the
        step's signals. A turn whose calls cannot be read is answered by one error message."""
        calls = parse_tool_calls(text)
        calls = calls if isinstance(calls, list) else [calls]
        seen = set(self.succeeded)  # outputs the model could have read when it wrote this turn
        outcomes = [self.run(c, seen) for c in calls]
        cost = sum(o.cost for o in outcomes)
        self.total_cost += cost
        signals = {
            "tool_calls": len(outcomes),
            "tool_errors": sum(o.error is not None for o in outcomes),
            "tool_cost": cost,
            "dependency_violation": sum(bool(o.missing) for o in outcomes),
            "dependency_respected": sum(o.respected for o in outcomes),
        }
        return [o.message for o in outcomes], signals

    def run(self, call: ToolCall | ToolCallError, seen: set[str] | None = None) -> CallOutcome:
        """One call (module docstring); `seen`: the tools whose output the model had read (default:
        every tool that has succeeded so far). Raises only `ToolServerError`."""
        reg = self.registry
        if isinstance(call, ToolCallError):
            return _error("", call.message)
        t = reg.tools.get(call.name)
        if t is None:
            return _error(
                call.name, f"unknown tool {call.name!r}; the tools are: {', '.join(reg.tools) or 'none'}"
            )
        problem = check_arguments(call.arguments, t.tool.parameters)
        if problem is not None:
            return _error(call.name, f"tool {call.name!r}: {problem}", t.cost)
        seen = self.succeeded if seen is None else seen
        missing = tuple(r for r in t.requires if r not in seen)
        if missing:
            first = ", ".join(map(repr, missing))
            why = f"tool {call.name!r} needs the output of {first}: call {'it' if len(missing) == 1 else 'them'} first"
            return _error(call.name, why, t.cost, missing)
        try:
            result = t.tool.fn(**call.arguments)
        except ToolServerError:
            raise
        except Exception as err:  # the tool's failure is an observation; KeyboardInterrupt still stops
            said = clip_text(str(err), reg.max_error_chars)
            return _error(call.name, f"tool {call.name!r} failed" + (f": {said}" if said else ""), t.cost,
                          respected=bool(t.requires))  # fmt: skip
        self.succeeded.add(call.name)
        content = clip_text(as_text(result), reg.max_output_chars)
        message = {"role": "tool", "name": call.name, "content": content}
        return CallOutcome(message, None, t.cost, respected=bool(t.requires))


def _error(name: str, why: str, cost: float = 0.0, missing: tuple[str, ...] = (), respected: bool = False):
    message = {"role": "tool", "name": name, "content": f"Error: {why}"}
    return CallOutcome(message, why, cost, missing, respected)
