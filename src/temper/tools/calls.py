"""Chat tool calls in the Hugging Face convention: tools declared as Python functions, their JSON
schemas, the calls an assistant turn writes, validated and run, each answered with a `tool`
message the model can read.

    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first addend
            b: the second addend
        \"\"\"
        return a + b

    registry = ToolRegistry([add])              # or [Tool.from_function(add), ...]
    tokenizer.apply_chat_template(messages, tools=registry.schemas, ...)
    calls = parse_tool_calls(assistant_text)    # list[ToolCall], or one ToolCallError
    messages += [registry.call(c) for c in calls] if isinstance(calls, list) else [registry.call(calls)]

Schemas are what `transformers.utils.get_json_schema` makes of the function (the one chat
templates receive when `tools=` holds a callable): the name, the docstring's description, one
property per argument from its type hint (str, int, float, bool, list[...], dict[...],
Literal[...] as an enum, Optional[...] as `nullable`, unions as a list of types) with the
description from the docstring's `Args:` section, and `required` for arguments without a default.

Calls are read in the Hermes/Qwen2.5 form most hub templates render and the built-in templates
write (`temper.models.tokenizer`): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

A bad call is the model's mistake, not the run's: malformed JSON, an unknown tool, a missing,
unknown or wrongly typed argument, and an exception the tool itself raises are each answered
with a tool message that says what was wrong (`Error: ...`), never raised. Tools run in this
process: they are the user's trusted code. Code the model writes runs only in `temper.sandbox`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MAX_OUTPUT_CHARS = 2000
"""Default cap on a tool result's characters in the tool message (the rest is cut and counted)."""
MAX_ERROR_CHARS = 500
"""Default cap on the exception text a failing tool's error message quotes."""

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


class ToolDefinitionError(ValueError):
    """A function that cannot be a tool (no docstring, an argument without a type hint or a
    description, two tools of one name): the user's code, raised when the registry is built."""


@dataclass(frozen=True)
class Tool:
    """A callable and the JSON schema the chat template shows the model."""

    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> Tool:
        """The tool of a typed, documented function (bound methods too), its schema made by
        `transformers.utils.get_json_schema`, so it is the one a hub template would render."""
        from transformers.utils import get_json_schema
        from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

        try:
            schema = get_json_schema(fn)
        except (DocstringParsingException, TypeHintParsingException) as err:
            raise ToolDefinitionError(f"{getattr(fn, '__name__', fn)!r} cannot be a tool: {err}") from None
        return cls(fn, schema)

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name, its arguments, and the block as the model wrote it."""

    name: str
    arguments: dict[str, Any]
    text: str


@dataclass(frozen=True)
class ToolCallError:
    """An assistant turn whose tool calls cannot be read; `message` says why, for the model."""

    message: str
    text: str  # the offending block (or the unclosed tail)


@dataclass(frozen=True)
class ToolResult:
    """The tool message answering one call, and the error it reports (None: the call succeeded)."""

    message: dict[str, Any]
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall] | ToolCallError:
    """The `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of an assistant turn,
    in order ([] when it has none: the turn is an answer). One malformed block makes the whole
    turn a `ToolCallError` and none of its calls run: a turn is answered as a whole, so the model
    re-issues it rather than seeing results for only the calls that happened to parse.

    Tolerated, as hub templates write them: whitespace and newlines around the JSON (Qwen2.5 puts
    the object on its own line) and `arguments` given as a JSON string (OpenAI's convention)."""
    calls: list[ToolCall] = []
    end = 0  # where the last closed block ends
    for match in _CALL.finditer(text):
        call = _parse_block(match.group(1), match.group(0))
        if isinstance(call, ToolCallError):
            return call
        calls.append(call)
        end = match.end()
    tail = text[end:]
    if OPEN in tail:
        unclosed = tail[tail.index(OPEN) :]
        return ToolCallError(f"a {OPEN} is not closed with {CLOSE}", unclosed)
    return calls


def parse_each_tool_call(text: str) -> list[ToolCall | ToolCallError]:
    """Every `<tool_call>` block of an assistant turn on its own, in order: a malformed block is
    a `ToolCallError` in its place and the others still stand (TRL answers each call of a turn
    separately; `parse_tool_calls` is the all-or-nothing reading). An unclosed last block is an error."""
    out: list[ToolCall | ToolCallError] = []
    end = 0
    for match in _CALL.finditer(text):
        out.append(_parse_block(match.group(1), match.group(0)))
        end = match.end()
    tail = text[end:]
    if OPEN in tail:
        out.append(ToolCallError(f"a {OPEN} is not closed with {CLOSE}", tail[tail.index(OPEN) :]))
    return out


def _parse_block(body: str, block: str) -> ToolCall | ToolCallError:
    def error(why: str) -> ToolCallError:
        return ToolCallError(
            f'{why}; write {OPEN}{{"name": <tool name>, "arguments": {{...}}}}{CLOSE}', block
        )

    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as err:
        return error(
            f"the tool call is not valid JSON ({err.msg} at column {err.colno}): {clip_text(body.strip(), 200)}"
        )
    if not isinstance(obj, dict):
        return error(f"the tool call must be a JSON object, got {_json_type(obj)}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return error('the tool call has no "name" string')
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return error(
            f'the tool call has {", ".join(map(repr, extra))} beside "name" and "arguments" (arguments go inside "arguments")'
        )
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends the arguments object encoded as a string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return error(f'the "arguments" string is not valid JSON ({err.msg} at column {err.colno})')
    if not isinstance(arguments, dict):
        return error(f'"arguments" must be a JSON object, got {_json_type(arguments)}')
    return ToolCall(name, arguments, block)


class ToolRegistry:
    """Tools by name; `call` validates a call against its tool's schema and runs it.

    max_output_chars: a result longer than this is cut, with a note of how much was cut (the
    model reads it; an unbounded result would eat the episode's token budget).
    max_error_chars: the same for the exception text in a failing tool's error message."""

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]],
        max_output_chars: int = MAX_OUTPUT_CHARS,
        max_error_chars: int = MAX_ERROR_CHARS,
    ):
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            tool = tool if isinstance(tool, Tool) else Tool.from_function(tool)
            if tool.name in self.tools:
                raise ToolDefinitionError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.max_output_chars, self.max_error_chars = max_output_chars, max_error_chars

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """What `apply_chat_template(..., tools=)` takes."""
        return [t.schema for t in self.tools.values()]

    def call(self, call: ToolCall | ToolCallError) -> dict[str, Any]:
        """The `tool` message answering `call`: the tool's result, or `Error: ...` saying what
        was wrong. Never raises on anything the model wrote or on the tool's own exception."""
        return self.run(call).message

    def run(self, call: ToolCall | ToolCallError) -> ToolResult:
        """`call`, with the error (if any) apart, for counting."""
        if isinstance(call, ToolCallError):
            return _failed("", call.message)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return _failed(call.name, f"unknown tool {call.name!r}; the tools are: {known}")
        problem = check_arguments(call.arguments, tool.parameters)
        if problem is not None:
            return _failed(call.name, f"tool {call.name!r}: {problem}")
        # the tool's failure is an observation for the model; KeyboardInterrupt still stops the run
        try:
            result = tool.fn(**call.arguments)
        except Exception as err:
            said = clip_text(str(err), self.max_error_chars)
            return _failed(
                call.name, f"tool {call.name!r} raised {type(err).__name__}" + (f": {said}" if said else "")
            )
        content = clip_text(as_text(result), self.max_output_chars)
        return ToolResult({"role": "tool", "name": call.name, "content": content})


def _failed(name: str, why: str) -> ToolResult:
    return ToolResult({"role": "tool", "name": name, "content": f"Error: {why}"}, why)


def as_text(result: Any) -> str:
    """A tool's return value as the tool message's content: text as it is, JSON for data."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


def clip_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


# JSON Schema type name -> the Python values json.loads gives for it. bool is an int subclass in
# Python, but JSON keeps `true` apart from 1, so an integer or number argument refuses a boolean.
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
_NAMES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
          "array": "an array", "object": "an object", "null": "null"}  # fmt: skip


def check_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool's `parameters` schema, or None. Unlike plain JSON
    Schema, an argument the schema does not name is refused: the function would raise TypeError."""
    properties = parameters.get("properties") or {}
    missing = [k for k in parameters.get("required") or [] if k not in arguments]
    if missing:
        return f"missing argument{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}"
    unknown = [k for k in arguments if k not in properties]
    if unknown:
        takes = ", ".join(map(repr, properties)) or "no arguments"
        return (
            f"unknown argument{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))} (it takes {takes})"
        )
    for key, value in arguments.items():
        problem = _check(value, properties[key], f"argument {key!r}")
        if problem is not None:
            return problem
    return None


def _check(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """The subset of JSON Schema that `get_json_schema` writes: type (one or a list), nullable,
    enum, items, prefixItems, additionalProperties; a schema without a type (`Any`) takes anything."""
    if value is None and schema.get("nullable"):
        return None
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if kinds and not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
        wanted = " or ".join(_NAMES.get(k, k) for k in kinds)
        return f"{where} must be {wanted}, got {_json_type(value)} {clip_text(json.dumps(value, ensure_ascii=False), 60)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {', '.join(json.dumps(v) for v in schema['enum'])}, got {json.dumps(value)}"
    if isinstance(value, list):
        prefix = schema.get("prefixItems")
        if prefix is not None and len(value) != len(prefix):
            return f"{where} must have {len(prefix)} items, got {len(value)}"
        for i, item in enumerate(value):
            sub = prefix[i] if prefix is not None else schema.get("items")
            if isinstance(sub, dict):
                problem = _check(item, sub, f"{where}[{i}]")
                if problem is not None:
                    return problem
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for k, item in value.items():
            problem = _check(item, schema["additionalProperties"], f"{where}[{k!r}]")
            if problem is not None:
                return problem
    return None


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (what the model wrote, in its terms)."""
    for name, test in _TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if _TYPES["number"](value) else type(value).__name__
