"""Tools with costs and dependencies (issue 10 item 6): the registry's observations and signals for
scripted call sequences, exactly; tools from a local stdio MCP server (listed as the server lists
them, called with the server's results and errors, a killed server an env_error); the multi_tool
task's demonstrations score 1 at exactly the cheapest chain's cost, the same over MCP as locally."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from fakes import Script  # tests/ is on the path (pytest rootdir mode)
from temper.catalog import make_task
from temper.data.chat import tokenize_messages
from temper.envs.multi_tool import MultiToolConfig, MultiToolTask, call_text, close_connections, registry_of
from temper.envs.shop_tools import world
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.tools.calls import ToolDefinitionError
from temper.tools.registry import PATH_SIGNALS, CostRegistry, ToolServerError

SERVER = ["-m", "temper.envs.mcp_servers.shop"]


def call(name, **arguments):
    return call_text(name, arguments)


def scripted_registry(log=None):
    registry = CostRegistry()

    @registry.tool(cost=0.25, requires=["lookup", "unit"])
    def convert(amount: int, rate_id: str) -> int:
        """Convert an amount.

        Args:
            amount: the amount
            rate_id: the rate's id
        """
        if rate_id != "R1":
            raise ValueError(f"no rate {rate_id}")
        return amount * 3

    @registry.tool(cost=0.5)
    def lookup(src: str) -> str:
        """Look up a rate.

        Args:
            src: the currency
        """
        return "R1"

    @registry.tool()
    def unit() -> str:
        """The unit."""
        return "eur"

    @registry.tool(cost=1.0)
    def down() -> str:
        """A backend that died."""
        raise ToolServerError("the server exited")

    return registry


def signals(calls=0, errors=0, cost=0.0, violation=0, respected=0):
    return {"tool_calls": calls, "tool_errors": errors, "tool_cost": cost, "dependency_violation": violation,
            "dependency_respected": respected}  # fmt: skip


def test_costs_and_dependencies_of_a_scripted_episode_exactly():
    ep = scripted_registry().episode()
    # the dependent tool first: refused, named, paid for, a violation
    assert ep.step(call("convert", amount=2, rate_id="R1")) == (
        [{"role": "tool", "name": "convert",
          "content": "Error: tool 'convert' needs the output of 'lookup', 'unit': call them first"}],
        signals(1, 1, 0.25, violation=1),
    )  # fmt: skip
    # both dependencies and the dependent call in one turn: the turn's own outputs are not yet seen
    messages, sig = ep.step(
        call("lookup", src="usd") + call("unit") + call("convert", amount=2, rate_id="R1")
    )
    assert [m["content"] for m in messages] == [
        "R1",
        "eur",
        "Error: tool 'convert' needs the output of 'lookup', 'unit': call them first",
    ]
    assert sig == signals(3, 1, 0.75, violation=1)
    # now met: it runs; a wrong id is the tool's failure (paid, respected, no violation)
    assert ep.step(call("convert", amount=2, rate_id="R1")) == (
        [{"role": "tool", "name": "convert", "content": "6"}],
        signals(1, 0, 0.25, respected=1),
    )
    assert ep.step(call("convert", amount=2, rate_id="R9")) == (
        [{"role": "tool", "name": "convert", "content": "Error: tool 'convert' failed: no rate R9"}],
        signals(1, 1, 0.25, respected=1),
    )
    # bad arguments pay; an unknown tool and a malformed call do not
    messages, sig = ep.step(call("lookup", currency="usd") + call("nope"))
    assert [m["content"] for m in messages] == [
        "Error: tool 'lookup': missing argument 'src'",
        "Error: unknown tool 'nope'; the tools are: convert, lookup, unit, down",
    ]
    assert sig == signals(2, 2, 0.5)
    messages, sig = ep.step("<tool_call>{oops</tool_call>")
    assert messages[0]["content"].startswith("Error: the tool call is not valid JSON") and sig == signals(
        1, 1
    )
    assert ep.total_cost == 0.25 + 0.75 + 0.25 + 0.25 + 0.5
    assert ep.step("no calls") == ([], signals())
    # a dead backend is raised (the env's step fails: env_error), never an observation
    with pytest.raises(ToolServerError, match="the server exited"):
        ep.step(call("down"))


def test_episodes_do_not_share_what_was_called():
    registry = scripted_registry()
    first = registry.episode()
    first.step(call("lookup", src="usd") + call("unit"))
    assert first.step(call("convert", amount=1, rate_id="R1"))[1]["dependency_respected"] == 1
    assert registry.episode().step(call("convert", amount=1, rate_id="R1"))[1]["dependency_violation"] == 1


def test_bad_tool_declarations_are_refused():
    def a() -> str:
        """A."""
        return ""

    def b() -> str:
        """B."""
        return ""

    with pytest.raises(ToolDefinitionError, match="requires 'c', which is not registered"):
        CostRegistry().add([a], requires={"a": ["c"]})
    with pytest.raises(ToolDefinitionError, match="cycle: a -> b -> a"):
        CostRegistry().add([a, b], requires={"a": ["b"], "b": ["a"]})
    with pytest.raises(ToolDefinitionError, match="costs names no such tool: z"):
        CostRegistry().add([a], costs={"z": 1.0})
    with pytest.raises(ToolDefinitionError, match="cost must be >= 0"):
        CostRegistry().add([a], costs={"a": -1.0})
    registry = CostRegistry()
    registry.tool(requires=["b"])(a)  # declared before its dependency: checked when an episode starts
    with pytest.raises(ToolDefinitionError, match="requires 'b'"):
        registry.episode()


# ---- MCP: one server for the module ----


@pytest.fixture(scope="module")
def mcp_task():
    task = make_task("multi_tool", mcp_command="python", mcp_args=SERVER)
    registry_of(task.config)  # starts the server
    yield task
    close_connections()


def test_mcp_tools_are_the_servers_listing(mcp_task):
    from temper.envs.mcp_servers.shop import build

    listed = asyncio.run(build().list_tools())  # what the server itself lists, in process
    schemas = registry_of(mcp_task.config).schemas
    assert (
        [s["function"]["name"] for s in schemas]
        == [t.name for t in listed]
        == ["price", "rate", "convert", "quote"]
    )
    assert [s["function"]["parameters"] for s in schemas] == [t.input_schema for t in listed]
    assert [s["function"]["description"] for s in schemas] == [t.description.strip() for t in listed]


def test_mcp_calls_return_the_servers_results_and_errors(mcp_task):
    shop = world(0, 64)
    item = next(iter(shop.items))
    ep = registry_of(mcp_task.config).episode()
    messages, sig = ep.step(
        call("price", item=item) + call("rate", src="usd", dst="eur") + call("price", item="zz")
    )
    assert [m["content"] for m in messages] == [
        shop.price(item),
        shop.rate("usd", "eur"),
        "Error: tool 'price' failed: no item named 'zz'",  # the server's error, as the local tool's
    ]
    assert sig == signals(3, 1, 0.01 + 0.02 + 0.01)  # the failed call pays too
    local = registry_of(MultiToolConfig()).episode()
    assert local.step(call("price", item="zz"))[0] == messages[2:]


def test_demonstrations_score_one_at_exactly_the_cheapest_cost_and_mcp_observes_the_same(mcp_task, tokenizer):
    task = make_task("multi_tool")
    problems = task.sample("train", 12, 0) + task.sample("ood", 4, 0)
    assert {len(task.cheapest_chain(p)) for p in problems} == {1, 3}  # both kinds of question
    for p in problems:
        messages = task.demonstration_messages(p)
        assert messages == mcp_task.demonstration_messages(p)  # every observation the same over MCP
        env = task.make_env(p)
        env.reset()
        rewards, sigs = [], []
        for m in messages[1:]:
            if m["role"] != "assistant":
                continue
            text = tokenizer.decode(tokenize_messages(tokenizer, [*env.reset(), m])[0])
            action = text.split("<|assistant|>")[1].removesuffix("<|end|>")  # the turn as rendered
            result = env.step(action)
            rewards.append(result.reward)
            sigs.append(result.signals)
        assert result.done and result.score.reward == 1.0 and result.score.correct
        cost = 0.01 if len(task.cheapest_chain(p)) == 1 else 0.05
        assert sum(rewards) == pytest.approx(-cost, abs=1e-12)
        assert result.score.details["tool_cost"] == pytest.approx(cost)
        assert sum(s.get("dependency_violation", 0) for s in sigs) == 0
        assert sum(s.get("dependency_respected", 0) for s in sigs) == (len(rewards) == 4)


def test_quote_is_demonstrated_when_it_is_the_cheaper_chain():
    task = make_task("multi_tool", quote_cost=0.03)
    p = next(
        p
        for p in task.sample("train", 20, 0)
        if p.data["currency"] != task.world.items[p.data["item"]].currency
    )
    assert task.cheapest_chain(p) == [("quote", {"item": p.data["item"], "currency": p.data["currency"]})]
    assert task.demonstration_messages(p)[-1] == {
        "role": "assistant",
        "content": f"Answer: {p.data['answer']}",
    }


def test_splits_are_seeded_disjoint_and_ood_items_unseen():
    task = MultiToolTask()
    train, test, ood = (set(task.questions(s)) for s in ("train", "test", "ood"))
    assert len(train) + len(test) == 48 * 4 and not train & test and len(ood) == 16 * 4
    assert not {i for i, _ in ood} & {i for i, _ in train | test}
    assert 0.15 < len(test) / (48 * 4) < 0.35
    assert [p.id for p in task.sample("test", 5, 1)] == [p.id for p in MultiToolTask().sample("test", 5, 1)]
    assert [p.id for p in task.sample("test", 5, 1)] != [p.id for p in task.sample("test", 5, 2)]
    assert len(task.sample("train", 500, 0)) == 500 and len(task.sample("test", 500, 0)) == len(test)


def test_env_rules_violations_limits_and_answers():
    task = make_task("multi_tool", max_calls=2)
    p = task.sample("train", 1, 0)[0]
    env = task.make_env(p)
    r = env.step(call("convert", amount=1, rate_id="r100"))
    assert r.signals["dependency_violation"] == 1 and r.reward == -0.02 and not r.done
    assert (
        r.messages[0]["content"]
        == "Error: tool 'convert' needs the output of 'price', 'rate': call them first"
    )
    env.step(call("price", item=p.data["item"]))
    r = env.step(call("quote", item=p.data["item"], currency=p.data["currency"]))  # past max_calls
    assert (
        r.done
        and not r.score.correct
        and r.score.details == {"reason": "max_calls", "tool_cost": 0.03, "turns": 2}
    )
    assert task.score(p, f"Answer: {p.data['answer']}").correct
    assert not task.score(p, f"Answer: {p.data['answer'] + 1}").correct
    assert not task.score(p, f"{p.data['answer']}").parsed
    assert MultiToolTask.path_signals == PATH_SIGNALS == {
        "dependency_violation": "violation", "dependency_respected": "compliance"}  # fmt: skip


def cheapest_reply(task):
    """A scripted policy that plays the cheapest chain of the question in the prompt."""

    def reply(text, j):
        question = text.split("<|user|>")[1].split("<|end|>")[0]
        p = next(p for p in task.sample("train", 200, 0) if p.prompt == question)
        turns = [call_text(n, a) for n, a in task.cheapest_chain(p)] + [task.demonstration(p)]
        return turns[text.count("<|assistant|>") - 1]

    return reply


def test_a_killed_server_is_an_env_error_in_the_loop(tokenizer):
    # the server this task starts (building a task lists its tools), not one an earlier test's
    # recipe check left running with the same arguments (closed at exit)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    task = make_task("multi_tool", mcp_command="python", mcp_args=[*SERVER, "--seed", "0"])  # its own server
    try:
        p = task.sample("train", 1, 0)[0]
        limits = EpisodeLimits(max_turns=5, max_new_tokens=96)
        [[ok]] = run_episodes(
            Script(tokenizer, cheapest_reply(task)), tokenizer, [[task.make_env(p)]], [0], limits
        )
        assert ok.stop_reason == "done" and ok.score.correct
        server = [
            c
            for c in psutil.Process().children(recursive=True)
            if "--seed" in c.cmdline() and c.pid not in before
        ]
        assert len(server) == 1
        server[0].kill()
        server[0].wait(10)
        [[dead]] = run_episodes(
            Script(tokenizer, cheapest_reply(task)), tokenizer, [[task.make_env(p)]], [0], limits
        )
        assert dead.stop_reason == "env_error" and dead.score is None
        # one line naming the env, the server (its command line) and what its stderr said
        assert dead.error.startswith("env MultiToolEnv.step raised: ToolServerError: MCP server '")
        assert "temper.envs.mcp_servers.shop --seed 0'" in dead.error and "stderr" in dead.error
    finally:
        close_connections()


@pytest.mark.parametrize("show_tools", [True, False])
def test_sft_trains_the_calls_and_answer_never_a_tool_result(tokenizer, show_tools):
    from types import SimpleNamespace

    from temper.data.chat import IGNORE, tokenize_example
    from temper.stages.sft import demonstrations

    task = make_task("multi_tool", show_tools=show_tools)
    [example] = demonstrations(SimpleNamespace(tasks={"multi_tool": task}), ["multi_tool"], "train", 1, 3)
    problem = task.sample("train", 1, 3)[0]
    assert example.messages == task.demonstration_messages(problem)
    assert example.tools == (registry_of(task.config).schemas if show_tools else None)
    tok = tokenize_example(tokenizer, example, 4096)
    trained = tokenizer.decode([t for t, lab in zip(tok.input_ids, tok.labels, strict=True) if lab != IGNORE])
    calls = "".join(call_text(n, a) + "<|end|>" for n, a in task.cheapest_chain(problem))
    assert trained == calls + f"Answer: {problem.data['answer']}<|end|>"
    assert ("price of an item" in tokenizer.decode(tok.input_ids)) == show_tools  # the schemas in the prompt


# ---- MCP server, costs and dependencies from the recipe ----

RECIPE = """\
name: t
model: {preset: nano}
tasks:
  multi_tool:
    show_tools: false
OPTIONS
stages:
  - kind: pretrain
    corpus: {tasks: [multi_tool], problems_per_task: 10}
    train: {max_steps: 1, batch_size: 2, warmup_steps: 0}
"""


def recipe_error(options: str) -> str:
    from temper.recipe import RecipeError, parse_recipe

    with pytest.raises(RecipeError) as err:
        parse_recipe(RECIPE.replace("OPTIONS", options), "r.yaml")
    return str(err.value)


@pytest.mark.parametrize(
    "options, located",
    [
        ("    costs: {qoute: 0.5}", "r.yaml:6: tasks.multi_tool.costs.qoute: costs names 'qoute', which is no tool "
         "of this task; the tools: price, rate, convert, quote"),
        ("    costs: {quote: -1}", "r.yaml:6: tasks.multi_tool.costs.quote: the cost of 'quote' must be a number >= 0"),
        ("    requires: {quote: [prise]}", "r.yaml:6: tasks.multi_tool.requires.quote: 'quote' requires 'prise', "
         "which is no tool of this task; the tools: price, rate, convert, quote"),
        ("    requires: {prise: []}", "r.yaml:6: tasks.multi_tool.requires.prise: requires names 'prise'"),
        ("    requires: {price: [convert]}", "r.yaml:6: tasks.multi_tool.requires: tool dependencies form a cycle: "
         "price -> convert -> price"),
        ("    requires: {quote: price}", "r.yaml:6: tasks.multi_tool.requires.quote: requires.quote must be a list"),
        ("    mcp: {comand: python}", "r.yaml:6: tasks.multi_tool.mcp.comand: unknown mcp key 'comand'; valid: command"),
        ("    mcp: {command: python}\n    mcp_command: python", "tasks.multi_tool.mcp: give the server as `mcp` or"),
        ("    mcp: {command: [python, -m, temper.no_such_server]}", "r.yaml:6: tasks.multi_tool.mcp: MCP server "),
    ],
)  # fmt: skip
def test_bad_tool_options_are_recipe_errors_at_their_key(options, located):
    assert located in recipe_error(options)


def test_an_mcp_server_costs_and_dependencies_from_the_recipe_drive_an_episode():
    """The recipe's server (the shipped shop, over stdio), its costs and a new dependency: an
    episode's rewards and signals follow them, and a tool the server does not list is refused."""
    from temper.catalog import make_recipe_task
    from temper.recipe import parse_recipe

    options = (
        "    mcp: {command: [python, -m, temper.envs.mcp_servers.shop], args: [--seed, 0], timeout_s: 20}\n"
        "    costs: {quote: 0.05, rate: 0.5}\n"
        "    requires: {quote: [price], convert: [price]}"
    )
    recipe = parse_recipe(RECIPE.replace("OPTIONS", options), "r.yaml")  # lists the server's tools
    try:
        task = make_recipe_task("multi_tool", recipe.tasks["multi_tool"])
        assert task.config.mcp.args == ("-m", "temper.envs.mcp_servers.shop", "--seed", "0")
        served = [
            c
            for c in psutil.Process().children(recursive=True)
            if "temper.envs.mcp_servers.shop" in c.cmdline()
        ]
        assert served, "the tools come from the server"
        shop = world(0, 64)
        p = next(
            p
            for p in task.sample("train", 50, 0)
            if shop.items[p.data["item"]].currency != p.data["currency"]
        )
        item, cur = p.data["item"], p.data["currency"]
        env = task.make_env(p)
        env.reset()
        r = env.step(call("quote", item=item, currency=cur))  # before price: the new dependency
        assert r.reward == -0.05 and r.signals == signals(1, 1, 0.05, violation=1)
        assert r.messages[0]["content"] == "Error: tool 'quote' needs the output of 'price': call it first"
        r = env.step(call("price", item=item))
        assert r.reward == -0.01 and r.signals == signals(1, 0, 0.01)
        r = env.step(call("quote", item=item, currency=cur))
        assert r.signals == signals(1, 0, 0.05, respected=1) and r.messages[0]["content"] == str(
            p.data["answer"]
        )
        r = env.step(f"Answer: {p.data['answer']}")
        assert r.done and r.score.correct and r.score.details["tool_cost"] == 0.11
        # convert now needs only price; rate costs 0.5 (the recipe's), so quote is the cheapest chain
        assert task.cheapest_chain(p) == [("quote", {"item": item, "currency": cur})]
        ep = registry_of(task.config).episode()
        ep.step(call("price", item=item))
        _, sig = ep.step(call("convert", amount=1, rate_id="r0"))
        assert sig["dependency_respected"] == 1 and sig["dependency_violation"] == 0
    finally:
        close_connections()


def test_closing_a_connection_whose_loop_just_closed_is_quiet():
    """The race a loaded machine hit: close() sees the serving thread alive, the thread then closes
    its event loop, and signalling that loop raised 'Event loop is closed' out of close()."""
    import threading

    from temper.tools.mcp import MCPConnection

    conn = MCPConnection.__new__(MCPConnection)
    conn.loop = asyncio.new_event_loop()
    conn.loop.close()  # the serving thread has already closed it ...
    release = threading.Event()
    conn._thread = threading.Thread(target=release.wait, daemon=True)
    conn._thread.start()  # ... but is still alive when close() looks
    conn._closing = asyncio.Event()
    threading.Timer(0.05, release.set).start()
    conn.close()  # must not raise; joins the thread
    assert not conn._thread.is_alive()
