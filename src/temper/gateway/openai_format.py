"""The bodies of OpenAI's `/v1/chat/completions` and `/v1/completions`, as the official `openai`
client sends and reads them: what temper takes from a request and what it answers.

Read from a chat request: `messages` (content as a string or a list of text parts), `tools`
(function schemas, rendered by the chat template as `apply_chat_template(tools=)` takes them),
`max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `stop`, `logprobs`, `user`
(an episode id). An answer's text is the model's turn as it wrote it; its `<tool_call>{...}`
blocks (`temper.tools.calls`, the Hermes form the templates render) become OpenAI
`tool_calls` with the arguments as a JSON string, and the text around them the `content`. A turn
whose calls do not parse is answered as plain text: the agent sees what the model wrote.

Beyond OpenAI's fields every answer carries the token ids (`prompt_token_ids` at the top, as
vLLM's `return_token_ids` gives them, and `token_ids` in the choice), so a harness can check
that what it trains on is what was served.

When the agent sends an assistant message back in its next request, `assistant_key` finds the
turn it echoes, so the turn is rendered from the model's own text (token-exact), never from the
client's re-serialisation of its tool calls.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from temper.tools.calls import CLOSE, OPEN, parse_tool_calls


class BadRequest(Exception):
    """A request temper cannot serve: answered with `status` and OpenAI's error body."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error_body(message: str, status: int) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def text_of(content: Any) -> str | None:
    """A message's content as one string (a list of text parts joined; None stays None)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise BadRequest("only text content parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise BadRequest(f"message content of type {type(content).__name__}, not a string or parts")


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages as chat-template messages: content as a string, the fields a
    template reads (`role`, `content`, `tool_calls`, `tool_call_id`, `name`) kept."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] is not a {{role, content}} object")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": text_of(m.get("content")) or ""}
        for key in ("tool_calls", "tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def tools_of_request(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's tool schemas (OpenAI's `{"type": "function", "function": {...}}` is what HF
    chat templates take too); None when it offers none."""
    tools = body.get("tools")
    if tools in (None, []):
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequest("`tools` must be a list of function schemas")
    return tools


def max_tokens(body: dict[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens") or default
    if not isinstance(value, int) or value < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {value!r}")
    return value


def stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [str(s) for s in stop]


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a model's turn: OpenAI's view of its `<tool_call>` blocks, the
    rest of the text as content (None when nothing but calls). A turn whose calls do not parse is
    all content."""
    calls = parse_tool_calls(text)
    if not isinstance(calls, list) or not calls:
        return text, []
    rest = text
    for c in calls:
        rest = rest.replace(c.text, "")
    rest = rest.replace(OPEN, "").replace(CLOSE, "").strip()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    tool_calls = [
        {
            "id": f"call_{digest}_{k}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for k, c in enumerate(calls)
    ]
    return rest or None, tool_calls


def assistant_key(message: dict[str, Any]) -> str:
    """What identifies an assistant turn the agent sends back: its content and its calls (name and
    arguments as parsed JSON, so the client's re-serialisation does not matter)."""
    calls = []
    for c in message.get("tool_calls") or []:
        f = c.get("function", {}) if isinstance(c, dict) else {}
        args = f.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        calls.append([f.get("name"), args])
    return json.dumps([(text_of(message.get("content")) or "").strip(), calls], sort_keys=True)


def _logprobs(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]
    }


def finish_reason(stop_reason: str, has_calls: bool) -> str:
    if stop_reason == "length":
        return "length"
    return "tool_calls" if has_calls else "stop"


def chat_response(
    model: str,
    text: str,
    stop_reason: str,
    prompt_ids: list[int],
    token_ids: list[int],
    logprobs: list[float] | None = None,
    tokens: list[str] | None = None,
) -> dict[str, Any]:
    """A chat completion: one choice whose message holds the turn's content and tool calls; with
    `logprobs` (and each token's text, `tokens`), OpenAI's per-token logprobs."""
    content, calls = split_tool_calls(text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason(stop_reason, bool(calls)),
        "logprobs": _logprobs(tokens, logprobs) if logprobs is not None and tokens is not None else None,
        "token_ids": list(token_ids),
    }
    return _envelope("chatcmpl-", "chat.completion", model, text, choice, prompt_ids, token_ids)


def completion_response(
    model: str,
    text: str,
    stop_reason: str,
    prompt_ids: list[int],
    token_ids: list[int],
    logprobs: list[float] | None = None,
    tokens: list[str] | None = None,
) -> dict[str, Any]:
    """A text completion (`/v1/completions`), OpenAI's legacy logprobs form."""
    lp = None
    if logprobs is not None and tokens is not None:
        lp = {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": None}
    choice = {
        "index": 0,
        "text": text,
        "finish_reason": "length" if stop_reason == "length" else "stop",
        "logprobs": lp,
        "token_ids": list(token_ids),
    }
    return _envelope("cmpl-", "text_completion", model, text, choice, prompt_ids, token_ids)


def _envelope(
    prefix: str,
    kind: str,
    model: str,
    text: str,
    choice: dict[str, Any],
    prompt_ids: list[int],
    token_ids: list[int],
) -> dict[str, Any]:
    """The response around one choice: an id, OpenAI's `object`, the usage, and the prompt's token
    ids (which OpenAI does not send, vLLM's `return_token_ids` does)."""
    return {
        "id": prefix + hashlib.sha256(f"{time.time_ns()}{text}".encode()).hexdigest()[:16],
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_ids, token_ids),
        "prompt_token_ids": list(prompt_ids),
    }


def _usage(prompt_ids: list[int], token_ids: list[int]) -> dict[str, int]:
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(token_ids),
        "total_tokens": len(prompt_ids) + len(token_ids),
    }
