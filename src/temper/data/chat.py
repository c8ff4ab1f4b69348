"""Chat-template tokenization with loss masks: labels are -100 everywhere but assistant tokens.

Why not `apply_chat_template(return_assistant_tokens_mask=True)`: it needs `{% generation %}`
markers that most hub templates (Qwen, Llama) lack. Instead each assistant turn's tokens are
found by rendering the conversation up to that turn with and without it; this works for any
template whose renderings are prefixes of each other, and fails loudly for one that is not.

Being a text prefix is not enough: the TOKENS of the prompt must be a prefix of the tokens of the
prompt with the answer. A BPE tokenizer with a template whose assistant header ends in a space
(`...\nAssistant: `) merges that space into the answer's first token (`Ġ33`), so the prompt's
last token (`Ġ`) is not in the full rendering and the answer's first token would sit before
`start`, never trained. Training it instead as the full rendering has it would teach a token
sequence the model never sees at inference (there the prompt ends in `Ġ`), so such a template is
refused, naming the boundary, as TRL refuses it ("not training-compatible").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from temper.data.formats import DataError, Example
from temper.labels import IGNORE

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedTokenizerBase


class TemplateError(ValueError):
    """A chat template whose renderings do not let assistant tokens be located exactly."""


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the token is not trained on
    truncated: bool


def render_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template; `tools`: JSON schemas
    the template lists (the Hugging Face convention; `[]` is passed as None, as TRL does, since
    some templates render their tool preamble for an empty list)."""
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=True,
    )
    return list(out["input_ids"])


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The chat prompt a policy continues: the conversation, then the assistant header.
    Evaluation, RL and the benchmarks all render prompts here, so they never differ."""
    return render_ids(tokenizer, messages, add_generation_prompt=True, tools=tools)


def tokenize_messages(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) with every assistant turn supervised, its tool calls included, and
    nothing else (tool results, like user turns, are never trained on)."""
    full = render_ids(tokenizer, messages, add_generation_prompt=False, tools=tools)
    labels = [IGNORE] * len(full)
    for name in _names(tools or []):
        if name not in tokenizer.decode(full):
            raise TemplateError(_dropped("`tools` it is given", name))
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prompt = render_ids(tokenizer, messages[:i], add_generation_prompt=True, tools=tools) if i else []
        upto = render_ids(tokenizer, messages[: i + 1], add_generation_prompt=False, tools=tools)
        if upto[: len(prompt)] != prompt and tokenizer.decode(upto).startswith(tokenizer.decode(prompt)):
            raise TemplateError(_merge_message(tokenizer, prompt, upto, i))
        if full[: len(upto)] != upto or upto[: len(prompt)] != prompt:
            raise TemplateError(
                "the chat template does not render conversations as prefixes of each other, so "
                "assistant tokens cannot be located; use a template without history rewriting"
            )
        labels[len(prompt) : len(upto)] = full[len(prompt) : len(upto)]
        turn = tokenizer.decode(full[len(prompt) : len(upto)])
        for name in _names(msg.get("tool_calls") or []):
            if name not in turn:
                raise TemplateError(_dropped(f"the `tool_calls` of message {i}", name))
    return full, labels


def _names(tools: list[Any]) -> list[str]:
    """The function names of tool schemas or tool calls (wrapped in "function" or not)."""
    out = []
    for t in tools:
        f = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(f, dict) and isinstance(f.get("name"), str):
            out.append(f["name"])
    return out


def _dropped(what: str, name: str) -> str:
    return (
        f"the chat template does not render {what} ({name!r} is not in the rendering), so the "
        "model would train on turns without the tools or calls they depend on; use a template "
        "with tool support (model.chat_template: temper or chatml; a tokenizer saved by temper "
        "before tool support has the old built-in template)"
    )


def check_tool_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise `TemplateError` unless the chat template renders `tools` and assistant `tool_calls`
    where masking can find them (once, before an agent run or tool SFT renders anything)."""
    probe = {"type": "function", "function": {"name": "zq_probe_tool", "parameters": {"type": "object"}}}
    call = {"type": "function", "function": {"name": "zq_probe_tool", "arguments": {}}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "zq_probe_tool", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]
    tokenize_messages(tokenizer, messages, tools=[probe])


def _merge_message(tokenizer: PreTrainedTokenizerBase, prompt: list[int], upto: list[int], i: int) -> str:
    """Name the boundary where the assistant header and the answer's first token merge."""
    k = next((j for j, (a, b) in enumerate(zip(prompt, upto, strict=False)) if a != b), len(prompt))
    header = prompt[k:]
    end = k + 1  # the answer's tokens from k up to the first that covers the whole header
    while end < len(upto) and len(tokenizer.decode(upto[k:end])) < len(tokenizer.decode(header)):
        end += 1
    merged = upto[k:end]
    return (
        "the chat template is not training-compatible with this tokenizer: the assistant prompt "
        f"before message {i} ends in {tokenizer.decode(prompt[max(k - 3, 0) :])!r}, whose last "
        f"{tokenizer.decode(header)!r} (tokens {tokenizer.convert_ids_to_tokens(header)}) merges with the answer into "
        f"{tokenizer.convert_ids_to_tokens(merged)}, so the answer's first token would never be "
        "trained; end the template's assistant header at a token boundary (a newline or a special "
        "token, not a trailing space)"
    )


def tokenize_example(tokenizer: PreTrainedTokenizerBase, example: Example, max_len: int) -> Tokenized:
    """Tokenize any supported row; truncation (right side) is flagged, never silent."""
    try:
        if example.messages is not None:
            ids, labels = tokenize_messages(tokenizer, example.messages, example.tools)
        elif isinstance(example.prompt, list):
            ids, labels = tokenize_messages(tokenizer, example.prompt + example.completion, example.tools)
            prompt_len = len(render_ids(tokenizer, example.prompt, True, example.tools))
            labels[:prompt_len] = [IGNORE] * prompt_len  # only the completion is trained on
        elif example.prompt is not None:
            prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
            completion = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
            completion = completion + [tokenizer.eos_token_id]
            ids, labels = prompt + completion, [IGNORE] * len(prompt) + completion
        else:
            ids = tokenizer(example.text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            labels = list(ids)
        if example.untrained:
            labels = mask_untrained(tokenizer, ids, labels, example.untrained)
    except TemplateError as err:
        # every row would hit it; the first one locates it for the user
        raise DataError(example.source, example.line, "<chat_template>", str(err)) from None
    truncated = len(ids) > max_len
    return Tokenized(ids[:max_len], labels[:max_len], truncated)


def mask_untrained(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], labels: list[int], spans: tuple[str, ...]
) -> list[int]:
    """`labels` with every trained occurrence of each span's tokens set to IGNORE. A span is found
    by its own tokenization inside the trained tokens; a tokenizer that merges it with its
    neighbours differently cannot be masked exactly and is refused."""
    labels = list(labels)
    for span in spans:
        target = tokenizer.encode(span, add_special_tokens=False)
        hits = [
            i
            for i in range(len(ids) - len(target) + 1)
            if ids[i : i + len(target)] == target
            and all(lab != IGNORE for lab in labels[i : i + len(target)])
        ]
        if not target or not hits:
            raise TemplateError(
                f"the environment's text {span!r} is not a token span of the assistant turn (the "
                "tokenizer merges it with its neighbours), so it cannot be left out of the loss"
            )
        for i in hits:
            labels[i : i + len(target)] = [IGNORE] * len(target)
    return labels
