"""Chat tool calls (issue 9 item 3): schemas from Python functions, parsing the Hermes/Qwen form,
argument validation, readable error turns, and a ToolEnv episode with a scripted policy."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from temper.data.chat import prompt_ids
from temper.envs.base import Env, StepResult
from temper.envs.tool_env import ToolEnv
from temper.tasks.base import Score
from temper.tools.calls import (
    Tool,
    ToolCall,
    ToolCallError,
    ToolDefinitionError,
    ToolRegistry,
    parse_tool_calls,
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def search(
    query: str,
    limit: int = 3,
    scale: float = 1.0,
    exact: bool = False,
    tags: list[str] | None = None,
    weights: dict[str, float] | None = None,
    mode: Literal["fast", "full"] = "fast",
) -> list[str]:
    """Search the notes.

    Args:
        query: what to look for
        limit: how many hits
        scale: a score multiplier
        exact: match whole words only
        tags: only notes with these tags
        weights: per-field weights
        mode: how hard to look
    """
    return [f"{query}:{mode}:{limit}"]


def divide(a: float, b: float) -> float:
    """Divide.

    Args:
        a: numerator
        b: denominator
    """
    return a / b


def shout(text: str) -> str:
    """Repeat the text many times.

    Args:
        text: what to repeat
    """
    return text * 1000


def fail(reason: str) -> str:
    """Raise with a long message.

    Args:
        reason: the message
    """
    raise RuntimeError(reason * 100)


REGISTRY = ToolRegistry([add, search, divide, shout, fail], max_output_chars=50, max_error_chars=40)


def test_schema_from_a_typed_documented_function():
    """The HF schema shape (transformers.utils.get_json_schema): name, docstring description,
    one property per argument with its JSON type, enum for Literal, nullable for Optional."""
    schema = Tool.from_function(search).schema
    assert schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for"},
                    "limit": {"type": "integer", "description": "how many hits"},
                    "scale": {"type": "number", "description": "a score multiplier"},
                    "exact": {"type": "boolean", "description": "match whole words only"},
                    "tags": {
                        "type": "array",
                        "items": {"type": "string"},
                        "nullable": True,
                        "description": "only notes with these tags",
                    },
                    "weights": {
                        "type": "object",
                        "additionalProperties": {"type": "number"},
                        "nullable": True,
                        "description": "per-field weights",
                    },
                    "mode": {"type": "string", "enum": ["fast", "full"], "description": "how hard to look"},
                },
                "required": ["query"],
            },
            "return": {"type": "array", "items": {"type": "string"}},
        },
    }
    assert REGISTRY.schemas[0]["function"]["name"] == "add" and len(REGISTRY.schemas) == 5


def test_functions_that_cannot_be_tools_are_refused_when_the_registry_is_built():
    def untyped(x):
        """X.

        Args:
            x: x
        """

    def undocumented(x: int):
        pass

    with pytest.raises(ToolDefinitionError, match=r"'untyped' cannot be a tool: .*type hint"):
        ToolRegistry([untyped])
    with pytest.raises(ToolDefinitionError, match=r"'undocumented' cannot be a tool: .*docstring"):
        Tool.from_function(undocumented)
    with pytest.raises(ToolDefinitionError, match="two tools are named 'add'"):
        ToolRegistry([add, Tool.from_function(add)])


def test_parse_one_call_two_calls_and_none():
    one = parse_tool_calls(
        'I will add.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    )
    assert one == [
        ToolCall(
            "add", {"a": 2, "b": 3}, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        )
    ]
    # Qwen2.5 puts the object on its own line; OpenAI sends arguments as a JSON string
    two = parse_tool_calls(
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in two] == [("add", {"a": 1, "b": 1}), ("search", {"query": "x"})]
    assert parse_tool_calls("The answer is 5.") == []
    assert parse_tool_calls('<tool_call>{"name": "add"}</tool_call>')[0].arguments == {}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            '<tool_call>{"name": "add", "arguments": {"a": 2,}}</tool_call>',
            "not valid JSON (Expecting property name",
        ),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object, got array"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name" string'),
        (
            '<tool_call>{"name": "add", "a": 2, "b": 3}</tool_call>',
            "'a', 'b' beside \"name\" and \"arguments\"",
        ),
        (
            '<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>',
            '"arguments" must be a JSON object, got array',
        ),
        ('<tool_call>{"name": "add", "arguments": "{2"}</tool_call>', '"arguments" string is not valid JSON'),
        ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}', "is not closed with </tool_call>"),
    ],
)
def test_malformed_calls_are_one_readable_error(text, why):
    # a good call before the bad one does not run either: the turn is answered as a whole
    got = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>' + text)
    assert isinstance(got, ToolCallError) and why in got.message
    assert got.text.startswith("<tool_call>") and got.text in text
    message = REGISTRY.call(got)
    assert (
        message["role"] == "tool" and message["content"].startswith("Error: ") and why in message["content"]
    )


def _call(name, **arguments):
    return REGISTRY.call(ToolCall(name, arguments, ""))


def test_a_good_call_is_answered_with_its_result():
    assert _call("add", a=2, b=3) == {"role": "tool", "name": "add", "content": "5"}
    assert _call("search", query="q", mode="full", tags=None, weights={"x": 1}) == {
        "role": "tool",
        "name": "search",
        "content": '["q:full:3"]',  # data comes back as JSON
    }
    assert _call("divide", a=1, b=4)["content"] == "0.25"  # an integer is a number


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("mul", {"a": 1}, "unknown tool 'mul'; the tools are: add, search, divide, shout, fail"),
        ("add", {"a": 1}, "tool 'add': missing argument 'b'"),
        ("add", {}, "tool 'add': missing arguments 'a', 'b'"),
        ("add", {"a": 1, "b": 2, "c": 3}, "tool 'add': unknown argument 'c' (it takes 'a', 'b')"),
        ("add", {"a": "2", "b": 3}, "tool 'add': argument 'a' must be an integer, got string \"2\""),
        ("add", {"a": 2.5, "b": 3}, "argument 'a' must be an integer, got number 2.5"),
        ("add", {"a": True, "b": 3}, "argument 'a' must be an integer, got boolean true"),
        ("add", {"a": None, "b": 3}, "argument 'a' must be an integer, got null null"),
        (
            "search",
            {"query": "q", "mode": "slow"},
            'argument \'mode\' must be one of "fast", "full", got "slow"',
        ),
        ("search", {"query": "q", "tags": ["a", 1]}, "argument 'tags'[1] must be a string, got integer 1"),
        (
            "search",
            {"query": "q", "weights": {"w": "x"}},
            "argument 'weights'['w'] must be a number, got string",
        ),
        ("search", {"query": "q", "exact": "yes"}, "argument 'exact' must be a boolean, got string"),
        ("search", {"query": ["q"]}, "argument 'query' must be a string, got array [\"q\"]"),
    ],
)
def test_bad_calls_are_answered_with_a_readable_error(name, arguments, error):
    message = _call(name, **arguments)
    assert message["role"] == "tool" and message["name"] == name
    assert message["content"].startswith("Error: ") and error in message["content"], message["content"]
    assert REGISTRY.run(ToolCall(name, arguments, "")).error is not None


def test_a_tool_that_raises_is_an_error_turn_with_type_and_truncated_message():
    assert (
        _call("divide", a=1, b=0)["content"]
        == "Error: tool 'divide' raised ZeroDivisionError: division by zero"
    )
    content = _call("fail", reason="boom ")["content"]
    assert (
        content
        == "Error: tool 'fail' raised RuntimeError: " + ("boom " * 8) + "... [460 more characters cut]"
    )


def test_long_output_is_truncated_with_a_count():
    content = _call("shout", text="ab")["content"]
    assert content == "ab" * 25 + "... [1950 more characters cut]"
    assert REGISTRY.run(ToolCall("shout", {"text": "ab"}, "")).error is None  # cut, not failed


class _Grader:
    def __init__(self):
        self.graded = []

    def __call__(self, answer: str) -> Score:
        self.graded.append(answer)
        return Score(float("5" in answer), "5" in answer, True)


def test_tool_env_episode_with_a_scripted_policy(tokenizer):
    """Call a tool, read the result, make a bad call, read the error, answer, graded."""
    question = [{"role": "user", "content": "What is 2+3? Use the tools."}]
    grader = _Grader()
    env = ToolEnv(question, ToolRegistry([add, divide]), grader)
    assert isinstance(env, Env) and env.stop == ()
    messages = env.reset()
    assert messages == question and messages[0] is not question[0]  # the env keeps its own copy
    # the tools reach the prompt through the chat template's `tools=`
    prompt = tokenizer.decode(prompt_ids(tokenizer, messages, tools=env.tools))
    assert prompt.startswith("<|system|># Tools\n<tools>\n" + json.dumps(env.tools[0]) + "\n")
    assert prompt.endswith("<|user|>What is 2+3? Use the tools.<|end|><|assistant|>")

    script = [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        'Checking.\n<tool_call>{"name": "divide", "arguments": {"a": 5, "b": 0}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 0}}</tool_call>',
        "The answer is 5.",
    ]
    first = env.step(script[0])
    assert first == StepResult(
        messages=[{"role": "tool", "name": "add", "content": "5"}],
        signals={"tool_calls": 1, "tool_errors": 0},
    )
    second = env.step(script[1])
    assert [m["content"] for m in second.messages] == [
        "Error: tool 'divide' raised ZeroDivisionError: division by zero",
        "Error: tool 'add': missing argument 'b'",
        "5",
    ]
    assert not second.done and second.signals == {"tool_calls": 3, "tool_errors": 2} and second.score is None
    assert grader.graded == []  # tool turns are not graded
    last = env.step(script[2])
    assert last.done and last.messages == [] and last.score == Score(1.0, True, True)
    assert last.signals == {"tool_calls": 0, "tool_errors": 0} and grader.graded == ["The answer is 5."]


def test_tool_env_a_malformed_call_is_not_an_answer_and_a_grader_bug_is_counted():
    env = ToolEnv([{"role": "user", "content": "q"}], ToolRegistry([add]), lambda answer: 1 / 0)
    bad = env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2</tool_call>')
    assert not bad.done and bad.signals == {"tool_calls": 1, "tool_errors": 1}
    assert bad.messages[0]["content"].startswith("Error: the tool call is not valid JSON")
    last = env.step("3")
    assert last.done and last.score.details["reason"] == "verifier_error"
    assert "ZeroDivisionError" in last.score.details["error"]


def test_tool_env_for_a_task_is_graded_by_the_task(tokenizer):
    from temper.catalog import make_task

    task = make_task("arithmetic")
    problem = task.sample("test", 1, seed=0)[0]
    env = ToolEnv.for_task(task, problem, ToolRegistry([add]))
    assert env.reset() == problem.messages()
    right = env.step(task.demonstration(problem))
    assert right.done and right.score.correct


def test_methods_tools_without_arguments_and_hand_written_schemas():
    """A bound method is a tool without `self` (TRL's environment_factory exposes an env's methods
    so); a tool may take nothing; a schema written by hand may leave `parameters` out."""

    class Board:
        def __init__(self):
            self.moves = []

        def move(self, direction: Literal["up", "down"]) -> str:
            """Move one step.

            Args:
                direction: where to
            """
            self.moves.append(direction)
            return f"moved {direction}"

    def now() -> str:
        """The time."""
        return "12:00"

    board = Board()
    clock = Tool(now, {"type": "function", "function": {"name": "clock", "description": "The time."}})
    registry = ToolRegistry([board.move, now, clock])
    assert registry.schemas[0]["function"]["parameters"]["required"] == ["direction"]
    assert registry.call(ToolCall("move", {"direction": "up"}, ""))[
        "content"
    ] == "moved up" and board.moves == ["up"]
    assert registry.call(ToolCall("now", {}, ""))["content"] == "12:00"
    assert registry.call(ToolCall("clock", {}, ""))["content"] == "12:00"
    got = registry.call(ToolCall("clock", {"tz": "UTC"}, ""))["content"]
    assert got == "Error: tool 'clock': unknown argument 'tz' (it takes no arguments)"
