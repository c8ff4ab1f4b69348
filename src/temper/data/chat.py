"""Chat-template tokenization with loss masks: labels are -100 everywhere but assistant tokens.

Why not `apply_chat_template(return_assistant_tokens_mask=True)`: it needs `{% generation %}`
markers that most hub templates (Qwen, Llama) lack. Instead each assistant turn's tokens are
found by rendering the conversation up to that turn with and without it; this works for any
template whose renderings are prefixes of each other, and fails loudly for one that is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from temper.data.formats import Example

IGNORE = -100


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the token is not trained on
    truncated: bool


def render_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
    )
    return list(out["input_ids"])


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[int]:
    """The chat prompt a policy continues: the conversation, then the assistant header.
    Evaluation, RL and the benchmarks all render prompts here, so they never differ."""
    return render_ids(tokenizer, messages, add_generation_prompt=True)


def tokenize_messages(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) with every assistant turn supervised and nothing else."""
    full = render_ids(tokenizer, messages, add_generation_prompt=False)
    labels = [IGNORE] * len(full)
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        start = len(render_ids(tokenizer, messages[:i], add_generation_prompt=True)) if i else 0
        upto = render_ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if full[: len(upto)] != upto or start > len(upto):
            raise ValueError(
                "the chat template does not render conversations as prefixes of each other, so "
                "assistant tokens cannot be located; use a template without history rewriting"
            )
        labels[start : len(upto)] = full[start : len(upto)]
    return full, labels


def tokenize_example(tokenizer: PreTrainedTokenizerBase, example: Example, max_len: int) -> Tokenized:
    """Tokenize any supported row; truncation (right side) is flagged, never silent."""
    if example.messages is not None:
        ids, labels = tokenize_messages(tokenizer, example.messages)
    elif isinstance(example.prompt, list):
        ids, labels = tokenize_messages(tokenizer, example.prompt + example.completion)
        prompt_len = len(render_ids(tokenizer, example.prompt, add_generation_prompt=True))
        labels[:prompt_len] = [IGNORE] * prompt_len  # only the completion is trained on
    elif example.prompt is not None:
        prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        completion = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
        completion = completion + [tokenizer.eos_token_id]
        ids, labels = prompt + completion, [IGNORE] * len(prompt) + completion
    else:
        ids = tokenizer(example.text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        labels = list(ids)
    truncated = len(ids) > max_len
    return Tokenized(ids[:max_len], labels[:max_len], truncated)
