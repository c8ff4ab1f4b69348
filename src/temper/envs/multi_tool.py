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
(`temper.agent.registry`), whose rules (a call pays its tool's cost; a dependency counts only when
met in an earlier turn) and signals this env passes on.

Rewards: the outcome is 1 for the right integer on a final `Answer: N` line; each step's process
reward is minus the cost of its calls, so with `rewards: {outcome: 1, process: 1}` an episode earns
outcome - total cost. Demonstrations play the cheapest correct chain (price alone, or
price -> rate -> convert, or quote where that is cheaper). Path signals (issue 10 contract):
dependency_violation (violation), dependency_respected (compliance).

Splits (seeded by `world_seed`): train and test are a stable hash split of the (item, currency)
questions over the first `items` items; ood asks about `ood_items` further items never seen in
training (their names must be copied into calls the policy never made).

MCP: with `mcp_command` (and `mcp_args`) the same tools come from that server over stdio
(`temper.agent.mcp`), e.g. `mcp_command: python, mcp_args: [-m, temper.envs.mcp_servers.shop]`;
costs and dependencies still come from this config. The server is started once per process at
the first env and closed at exit (or `close()`); its failure is an env_error, never a reward.
`show_tools: false` leaves the tool schemas out of the prompt (the tiny default learns the
protocol from the demonstrations; the schemas alone would be ~700 of its 512 positions).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.agent.registry import PATH_SIGNALS, CostRegistry
from temper.envs.base import StepResult
from temper.envs.shop_tools import CURRENCIES, world
from temper.tasks.base import Problem, Score, check_split, draw, split_of

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "mcp_args", tuple(str(a) for a in self.mcp_args))
        if self.items < 1 or self.ood_items < 1 or self.max_calls < 1 or not 0 < self.test_fraction < 1:
            raise ValueError("need items >= 1, ood_items >= 1, max_calls >= 1 and 0 < test_fraction < 1")
        if min(self.price_cost, self.rate_cost, self.convert_cost, self.quote_cost) < 0:
            raise ValueError("tool costs must be >= 0")
        if self.mcp_args and not self.mcp_command:
            raise ValueError("mcp_args without mcp_command")

    @property
    def costs(self) -> dict[str, float]:
        return {"price": self.price_cost, "rate": self.rate_cost, "convert": self.convert_cost,
                "quote": self.quote_cost}  # fmt: skip


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
        if not config.mcp_command:
            tools = world(config.world_seed, config.items + config.ood_items).tools()
        else:
            from temper.agent.mcp import MCPConnection

            connection = MCPConnection(config.mcp_command, config.mcp_args, timeout_s=config.mcp_timeout_s)
            tools = connection.tools()
        registry = CostRegistry().add(tools, config.costs, REQUIRES)
        _registries[config] = (registry, connection)
        return registry


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
        it, costs = self.world.items[item], self.config.costs
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
