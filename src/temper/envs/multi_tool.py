"""multi_tool: questions answered by a chain of tool calls with costs and dependencies (AWorld-style),
the tools local or served by an MCP server (issue 10 item 6).

    user        price of kadu in eur?
    assistant   <tool_call>{"name": "price", "arguments": {"item": "kadu"}}</tool_call>
    tool        7 usd                                              (the environment's, never trained on)
    assistant   <tool_call>{"name": "rate", "arguments": {"src": "usd", "dst": "eur"}}</tool_call>
    tool        r417
    assistant   <tool_call>{"name": "convert", "arguments": {"amount": 7, "rate_id": "r417"}}</tool_call>
    tool        21
    assistant   Answer: 21

The world (`temper.envs.shop_tools`): items with a price in a home currency; `rate` gives an opaque
rate id, `convert(amount, rate_id)` applies the hidden factor and `requires` both `price` and
`rate` (it needs their outputs), `quote(item, currency)` does it all in one call at a much higher
cost. An item asked for in its home currency needs only `price`. Tools are called in the HF
convention (`<tool_call>` blocks, one `tool` message per call) through a `CostRegistry`
(`temper.tools.registry`), whose rules (a call pays its tool's cost; a dependency counts only when
met in an earlier turn) and signals this env passes on.

Rewards: the outcome is 1 for the right integer on a final `Answer: N` line; each step's process
reward is minus the cost of its calls, so with `rewards: {outcome: 1, process: 1}` an episode earns
outcome - total cost. Demonstrations play the cheapest correct chain (price alone, or
price -> rate -> convert, or quote where that is cheaper). Path signals (issue 10 contract):
dependency_violation (violation), dependency_respected (compliance).

Splits (seeded by `world_seed`): train and test are a stable hash split of the (item, currency)
questions over the first `items` items; ood asks about `ood_items` further items never seen in
training (their names must be copied into calls the policy never made).

MCP, costs and dependencies from the recipe: with `mcp` the tools come from that server over
stdio (`temper.tools.mcp`); `costs` and `requires` set any listed tool's cost per call and the
tools whose output it needs (MCP has no fields for either), e.g.

    multi_tool:
      mcp: {command: [python, -m, temper.envs.mcp_servers.shop], args: [--seed, 0], timeout_s: 30}
      costs: {quote: 0.5}              # over price_cost, rate_cost, ...: any tool by its name
      requires: {quote: [price]}       # replaces the default {convert: [price, rate]} per tool named

(`mcp_command` and `mcp_args` are the older spelling of `mcp`.) The task lists its tools when it
is built, so a recipe is checked against them before anything runs: a tool name in `costs` or
`requires` that the tools do not have is an error at that key naming the tools there are, a cycle
of dependencies is an error at `requires`, and a server that does not start is an error at
`mcp`. The server is started once per process (at that check) and closed at exit (or `close()`);
its failure during an episode is an env_error, never a reward. Demonstrations play the shop's
chains (price, rate, convert, or quote): a `requires` the chain breaks makes them raise.
`show_tools: false` leaves the tool schemas out of the prompt (the tiny default learns the
protocol from the demonstrations; the schemas alone would be ~700 of its 512 positions).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.envs.base import StepResult
from temper.envs.shop_tools import CURRENCIES, world
from temper.tasks.base import Problem, Score, TaskOptionError, check_split, draw, split_of
from temper.tools.calls import Tool, ToolDefinitionError
from temper.tools.registry import PATH_SIGNALS, CostRegistry, ToolServerError

_ANSWER = re.compile(r"Answer:\s*(-?\d+)\s*$")
REQUIRES = {"convert": ("price", "rate")}


@dataclass(frozen=True)
class MultiToolConfig:
    world_seed: int = 0
    """The shop world (items, prices, rates); an MCP server must be started with the same seed."""
    items: int = 48
    """Items of the train and test questions (4 currencies each)."""
    ood_items: int = 16
    """Further items, asked about only in the ood split."""
    test_fraction: float = 0.25
    """Share of the (item, currency) questions held out as test."""
    price_cost: float = 0.01
    rate_cost: float = 0.02
    convert_cost: float = 0.02
    quote_cost: float = 0.2
    max_calls: int = 4
    """Tool-calling turns per episode; an action after the last one must answer."""
    show_tools: bool = True
    """Render the tool schemas in the prompt (`apply_chat_template(tools=...)`)."""
    mcp_command: str = ""
    """Serve the tools from this MCP server (stdio) instead of locally; "python" is this interpreter."""
    mcp_args: tuple[str, ...] = ()
    mcp_timeout_s: float = 30.0
    """The longest one MCP call may take (then the episode is an env_error)."""
    mcp: Any = None
    """The tools' MCP server (stdio): {command: [python, -m, module] (or a string), args: [...],
    env: {NAME: value}, cwd: folder, timeout_s: 30}; "python" is this interpreter."""
    costs: Any = None
    """Cost per call by tool name, over the *_cost fields; any tool the task has (an MCP server's
    own included)."""
    requires: Any = None
    """The tools whose output a tool needs, by tool name: replaces the default {convert: [price,
    rate]} for each tool named (`[]`: none)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mcp_args", tuple(str(a) for a in self.mcp_args))
        object.__setattr__(self, "mcp", _server_spec(self))
        object.__setattr__(self, "costs", _cost_pairs(self.costs))
        object.__setattr__(self, "requires", _require_pairs(self.requires))
        if self.items < 1 or self.ood_items < 1 or self.max_calls < 1 or not 0 < self.test_fraction < 1:
            raise ValueError("need items >= 1, ood_items >= 1, max_calls >= 1 and 0 < test_fraction < 1")
        if min(self.price_cost, self.rate_cost, self.convert_cost, self.quote_cost) < 0:
            raise ValueError("tool costs must be >= 0")

    @property
    def tool_costs(self) -> dict[str, float]:
        """Cost per call of every tool named: the shop's *_cost fields, then `costs`."""
        return {"price": self.price_cost, "rate": self.rate_cost, "convert": self.convert_cost,
                "quote": self.quote_cost} | dict(self.costs)  # fmt: skip

    @property
    def tool_requires(self) -> dict[str, tuple[str, ...]]:
        return dict(REQUIRES) | dict(self.requires)


@dataclass(frozen=True)
class MCPServerSpec:
    """An MCP server to start over stdio (`temper.tools.mcp.MCPConnection`'s arguments)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    timeout_s: float = 30.0

    def connect(self):
        from temper.tools.mcp import MCPConnection

        return MCPConnection(self.command, self.args, dict(self.env), self.cwd, timeout_s=self.timeout_s)


_MCP_KEYS = ("command", "args", "env", "cwd", "timeout_s")


def _server_spec(c: MultiToolConfig) -> MCPServerSpec | None:
    """`mcp` (or the older `mcp_command`/`mcp_args`) as a spec; errors located at the key."""
    if isinstance(c.mcp, MCPServerSpec):
        return c.mcp
    if c.mcp is None:
        if c.mcp_args and not c.mcp_command:
            raise TaskOptionError(("mcp_args",), "mcp_args without mcp_command")
        return MCPServerSpec(c.mcp_command, c.mcp_args, (), None, c.mcp_timeout_s) if c.mcp_command else None
    if c.mcp_command or c.mcp_args:
        raise TaskOptionError(("mcp",), "give the server as `mcp` or as `mcp_command`/`mcp_args`, not both")
    if not isinstance(c.mcp, dict):
        raise TaskOptionError(("mcp",), f"mcp must be a mapping with keys {', '.join(_MCP_KEYS)}")
    for key in c.mcp:
        if key not in _MCP_KEYS:
            raise TaskOptionError(("mcp", key), f"unknown mcp key {key!r}; valid: {', '.join(_MCP_KEYS)}")
    command = c.mcp.get("command")
    parts = [command] if isinstance(command, str) else command
    if not isinstance(parts, list) or not parts or not all(isinstance(x, (str, int, float)) for x in parts):
        raise TaskOptionError(
            ("mcp", "command"), "mcp.command must be a program, or a list: the program and its arguments"
        )
    args = c.mcp.get("args", [])
    if not isinstance(args, list):
        raise TaskOptionError(("mcp", "args"), "mcp.args must be a list")
    env = c.mcp.get("env", {})
    if not isinstance(env, dict):
        raise TaskOptionError(("mcp", "env"), "mcp.env must be a mapping of variable names to values")
    timeout = c.mcp.get("timeout_s", c.mcp_timeout_s)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise TaskOptionError(("mcp", "timeout_s"), f"mcp.timeout_s must be a number > 0, got {timeout!r}")
    cwd = c.mcp.get("cwd")
    return MCPServerSpec(str(parts[0]), tuple(str(a) for a in [*parts[1:], *args]),
                         tuple(sorted((str(k), str(v)) for k, v in env.items())),
                         None if cwd is None else str(cwd), float(timeout))  # fmt: skip


def _cost_pairs(costs: Any) -> tuple[tuple[str, float], ...]:
    if isinstance(costs, tuple):
        return costs
    if not isinstance(costs, dict | None):
        raise TaskOptionError(("costs",), "costs must be a mapping of tool names to costs per call")
    out = []
    for name, cost in (costs or {}).items():
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not cost >= 0:  # NaN too
            raise TaskOptionError(
                ("costs", name), f"the cost of {name!r} must be a number >= 0, got {cost!r}"
            )
        out.append((str(name), float(cost)))
    return tuple(out)


def _require_pairs(requires: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if isinstance(requires, tuple):
        return requires
    if not isinstance(requires, dict | None):
        raise TaskOptionError(
            ("requires",), "requires must be a mapping of tool names to lists of tool names"
        )
    out = []
    for name, needs in (requires or {}).items():
        if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
            raise TaskOptionError(
                ("requires", name), f"requires.{name} must be a list of tool names, got {needs!r}"
            )
        out.append((str(name), tuple(needs)))
    return tuple(out)


_registries: dict[MultiToolConfig, tuple[CostRegistry, Any]] = {}  # config -> (registry, MCP connection)
_lock = threading.Lock()


def registry_of(config: MultiToolConfig) -> CostRegistry:
    """The config's tools: local functions of the world, or the MCP server's, started on first
    use (one per config in this process; started again if it has died). Registries are stateless
    (an episode's calls live in its `ToolEpisode`), so every env of a config shares one."""
    with _lock:
        registry, connection = _registries.get(config, (None, None))
        if registry is not None and (connection is None or connection.alive):
            return registry
        if config.mcp is None:
            tools = [
                Tool.from_function(f)
                for f in world(config.world_seed, config.items + config.ood_items).tools()
            ]
        else:
            connection = config.mcp.connect()
            tools = connection.tools()
        try:
            registry = CostRegistry().add(tools, *_declared(config, [t.name for t in tools]))
        except BaseException:
            if connection is not None:
                connection.close()
            raise
        _registries[config] = (registry, connection)
        return registry


def _declared(
    config: MultiToolConfig, names: list[str]
) -> tuple[dict[str, float], dict[str, tuple[str, ...]]]:
    """The costs and dependencies of the tools `names`: the shop's defaults for the shop's tools
    that are there, and every tool the recipe's `costs` and `requires` name, which must be there
    (a TaskOptionError at the key naming the tools, so a typo cannot make a tool free)."""
    there = ", ".join(names) or "none"
    for key, table in (("costs", config.costs), ("requires", config.requires)):
        for name, value in table:
            if name not in names:
                raise TaskOptionError(
                    (key, name), f"{key} names {name!r}, which is no tool of this task; the tools: {there}"
                )
            for needed in value if key == "requires" else ():
                if needed not in names:
                    raise TaskOptionError(
                        (key, name),
                        f"{name!r} requires {needed!r}, which is no tool of this task; the tools: {there}",
                    )
    costs = {k: v for k, v in config.tool_costs.items() if k in names}
    requires = {k: v for k, v in config.tool_requires.items() if k in names and set(v) <= set(names)}
    return costs, requires


def check_tools(config: MultiToolConfig) -> None:
    """List the config's tools (starting its MCP server) and check `costs` and `requires`
    against them; every error a TaskOptionError at its key (a recipe error before anything runs)."""
    try:
        registry_of(config)
    except ToolServerError as err:
        raise TaskOptionError(("mcp",), str(err)) from err
    except ToolDefinitionError as err:  # a cycle, or a shop default the listing breaks
        raise TaskOptionError(("requires",), str(err)) from err


def close_connections() -> None:
    """Close every MCP server this module started (also done at interpreter exit)."""
    with _lock:
        for _, connection in _registries.values():
            if connection is not None:
                connection.close()
        _registries.clear()


@dataclass(frozen=True)
class MultiToolTask:
    """Shop questions played as tool-calling episodes (module docstring)."""

    config: MultiToolConfig = field(default_factory=MultiToolConfig)
    name: ClassVar[str] = "multi_tool"
    config_type: ClassVar[type] = MultiToolConfig
    path_signals: ClassVar[dict[str, str]] = PATH_SIGNALS

    def __post_init__(self) -> None:
        check_tools(self.config)  # the recipe's costs and requires against the tools there are

    @property
    def max_turns(self) -> int:
        return self.config.max_calls + 1

    @property
    def world(self):
        c = self.config
        return world(c.world_seed, c.items + c.ood_items)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The schemas the prompt shows (None with `show_tools: false`)."""
        return registry_of(self.config).schemas if self.config.show_tools else None

    def questions(self, split: str) -> list[tuple[str, str]]:
        check_split(split)
        names = list(self.world.items)
        c = self.config
        if split == "ood":
            return [(n, cur) for n in names[c.items :] for cur in CURRENCIES]
        pairs = [(n, cur) for n in names[: c.items] for cur in CURRENCIES]
        return [p for p in pairs if split_of(f"multi_tool/{p[0]}/{p[1]}", c.test_fraction) == split]

    def problem(self, split: str, item: str, currency: str) -> Problem:
        data = {"item": item, "currency": currency, "answer": self.world.answer(item, currency)}
        return Problem(self.name, split, f"{item}-{currency}", f"price of {item} in {currency}?", data)

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` questions of `split`: with repeats for train (RL and SFT always get n), without for
        the held-out splits (at most all of them)."""
        chosen = draw(self.questions(split), f"multi_tool:{split}:{seed}", n, repeat=split == "train")
        return [self.problem(split, item, cur) for item, cur in chosen]

    def make_env(self, problem: Problem) -> MultiToolEnv:
        return MultiToolEnv(self, problem, registry_of(self.config))

    def score(self, problem: Problem, completion: str) -> Score:
        """The integer on the completion's final `Answer: N` line."""
        match = _ANSWER.search(completion.strip())
        if match is None:
            return Score(0.0, False, False, {"reason": "no_answer"})
        correct = int(match.group(1)) == problem.data["answer"]
        return Score(float(correct), correct, True, {"reason": "answer"})

    def cheapest_chain(self, problem: Problem) -> list[tuple[str, dict[str, Any]]]:
        """The calls of the cheapest correct chain, in order (one per turn)."""
        item, cur = problem.data["item"], problem.data["currency"]
        it, costs = self.world.items[item], self.config.tool_costs
        if it.currency == cur:
            chain = [("price", {"item": item})]
        else:
            rid = self.world.rate_ids[(it.currency, cur)]
            chain = [("price", {"item": item}), ("rate", {"src": it.currency, "dst": cur}),
                     ("convert", {"amount": it.price, "rate_id": rid})]  # fmt: skip
        if costs["quote"] < sum(costs[name] for name, _ in chain):
            chain = [("quote", {"item": item, "currency": cur})]
        return chain

    def demonstration_messages(self, problem: Problem) -> list[dict[str, Any]]:
        """The cheapest correct chain as a conversation: one assistant turn per call (HF
        `tool_calls`), the env's tool message after each, then `Answer: N`; played through the
        env, so every observation is the env's own. SFT trains the assistant turns only."""
        env = self.make_env(problem)
        messages = env.reset()
        for name, arguments in self.cheapest_chain(problem):
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            result = env.step(call_text(name, arguments))
            if result.signals["tool_errors"]:
                raise AssertionError(f"the chain of {problem.id} failed: {result.messages}")  # a bug
            messages += result.messages
        answer = self.demonstration(problem)
        messages.append({"role": "assistant", "content": answer})
        if not env.step(answer).score.correct:
            raise AssertionError(f"the chain of {problem.id} did not answer correctly")
        return messages

    def demonstration(self, problem: Problem) -> str:
        """The final answer turn."""
        return f"Answer: {problem.data['answer']}"

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt} {self.demonstration(problem)}"

    def close(self) -> None:
        close_connections()


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call as the built-in template renders an assistant's `tool_calls` (and the parser reads)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}</tool_call>"


class MultiToolEnv:
    """One question: tool-calling turns through the registry, then the answer (module docstring)."""

    stop = ()  # a tool call ends the assistant turn, as in the chat convention

    def __init__(self, task: MultiToolTask, problem: Problem, registry: CostRegistry):
        self.task, self.problem = task, problem
        self.calls = registry.episode()
        self.turns = 0  # tool-calling turns so far
        self.tools = registry.schemas if task.config.show_tools else None

    def reset(self) -> list[dict[str, Any]]:
        return self.problem.messages()

    def step(self, action: str) -> StepResult:
        if "<tool_call>" not in action:  # the answer
            score = self.task.score(self.problem, action)
            return StepResult(done=True, score=self._with_cost(score), signals={"tool_calls": 0})
        if self.turns >= self.task.config.max_calls:  # one call too many: graded as it stands, wrong
            score = Score(0.0, False, True, {"reason": "max_calls"})
            return StepResult(done=True, score=self._with_cost(score), signals={"tool_calls": 0})
        self.turns += 1
        messages, signals = self.calls.step(action)  # raises ToolServerError: an env_error
        return StepResult(messages=messages, reward=-signals["tool_cost"], signals=signals)

    def _with_cost(self, score: Score) -> Score:
        details = {**score.details, "tool_cost": round(self.calls.total_cost, 6), "turns": self.turns}
        return Score(score.reward, score.correct, score.parsed, details)
