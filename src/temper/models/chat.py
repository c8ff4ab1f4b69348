"""Chat template and end of turn: the recipe's `model.chat_template` and `model.eos_token`, and
the check that a model's completions stop where its template ends a turn.

Why an `eos_token` option: a base model's tokenizer often names one end-of-sequence token
(Qwen2 base: `<|endoftext|>`) while its chat template ends each turn with another (`<|im_end|>`).
SFT teaches the model to end its answer with the template's token; if generation stops only at
the tokenizer's eos, every completion runs on to max_new_tokens and reads as "truncated" or
"unparsed". Setting `eos_token` makes the tokenizer's eos, the sampler's stop ids and the saved
`generation_config.eos_token_id` (a list that keeps the base eos too, as Qwen2.5-Instruct ships:
`[151645, 151643]`) agree, so `model.generate` on temper's output stops too.

Both are stored the Hugging Face way in the saved model folder: the template in
`chat_template.jinja` (`tokenizer.save_pretrained`), the eos in `tokenizer_config.json`
(`eos_token`) and `generation_config.json` (`eos_token_id`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from temper.models.tokenizer import CHAT_TEMPLATE

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


# Built-in templates for tokenizers that have none. Each renders a conversation as a prefix of
# the same conversation with one more turn (what assistant-only masking needs, temper.data.chat)
# and ends its assistant header at a special token or a newline, never a space.
TEMPLATES: dict[str, str] = {
    # temper's own (the built-in tokenizer's): <|role|>content<|end|>
    "temper": CHAT_TEMPLATE,
    # ChatML (Qwen, OpenAI): https://github.com/openai/openai-python/blob/release-v0.28.0/chatml.md
    # Tools as Qwen2.5-Instruct renders them (its tokenizer_config.json: the `# Tools` system text,
    # `<tool_call>\\n{json}\\n</tool_call>` after the content), except that each `tool` result is
    # its own `tool` turn (Qwen groups consecutive results in one user turn, which is not a prefix
    # of the conversation with one more result); without tools it renders as before, token for token.
    "chatml": (
        "{% if tools %}{{ '<|im_start|>system\\n' }}"
        "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
        "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
        "provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
        "{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
        "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
        'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}{% endif %}"
        "{% for message in messages %}{% if not (tools and loop.first and message['role'] == 'system') %}"
        "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
        "{{ '<|im_start|>assistant\\n' + (message['content'] or '') }}"
        "{% for c in message['tool_calls'] %}{% set f = c['function'] if c['function'] is defined else c %}"
        "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
        "{{ '<tool_call>\\n{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' }}"
        "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ (f['arguments'] or {}) | tojson }}{% endif %}"
        "{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
        "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endif %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    # Llama 3 (meta-llama/Meta-Llama-3-8B-Instruct's tokenizer_config.json, without the system default)
    "llama3": (
        "{% if bos_token %}{{ bos_token }}{% endif %}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    # Zephyr (HuggingFaceH4/zephyr-7b-beta): each turn ends with the tokenizer's eos
    "zephyr": (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
}

MARK_OPEN, MARK_CLOSE = "⟨", "⟩"
"""How a special token is shown inside a completion (eval examples, the report): ⟨<|im_end|>⟩."""


class ChatTemplateError(ValueError):
    """A chat template or eos token the tokenizer cannot use as asked (one line, names the option)."""


@dataclass(frozen=True)
class ChatOptions:
    """The recipe's `model.chat_template` and `model.eos_token` (None: keep the tokenizer's)."""

    chat_template: str | None = None
    """A built-in name (`TEMPLATES`), a path to a Jinja file, or the template text itself."""
    eos_token: str | None = None

    def __bool__(self) -> bool:
        return self.chat_template is not None or self.eos_token is not None

    def hashed(self, base_dir: Path) -> dict[str, str]:
        """What a stage's settings hash covers: the set options, a template by its text's digest
        (so editing the Jinja file reruns the stages that use it)."""
        out = {}
        if self.chat_template is not None:
            text = template_text(self.chat_template, base_dir)
            out["chat_template"] = hashlib.sha256(text.encode()).hexdigest()[:16]
        if self.eos_token is not None:
            out["eos_token"] = self.eos_token
        return out


def _is_template_text(value: str) -> bool:
    return "{{" in value or "{%" in value


def template_text(value: str, base_dir: Path | None = None) -> str:
    """The Jinja text of a `chat_template` option: a built-in name, inline template text, or a
    file (relative paths against `base_dir`, the recipe's folder)."""
    if value in TEMPLATES:
        return TEMPLATES[value]
    if _is_template_text(value):
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise ChatTemplateError(
            f"model.chat_template {value!r} is neither a built-in template ({', '.join(TEMPLATES)}) "
            f"nor a file ({path} does not exist)"
        )
    return path.read_text(encoding="utf-8")


def apply_chat_options(
    model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    options: ChatOptions,
    base_dir: Path | None = None,
) -> None:
    """Set the template and the eos of `tokenizer` (and the eos ids of `model`'s generation config)
    in place; idempotent, so a stage may apply them to a model an earlier stage saved with them."""
    if options.chat_template is not None:
        tokenizer.chat_template = template_text(options.chat_template, base_dir)
    if options.eos_token is not None:
        eos_id = token_id(tokenizer, options.eos_token)
        tokenizer.eos_token = options.eos_token
        if (
            tokenizer.eos_token_id != eos_id
        ):  # the setter looks the text up as a vocabulary key, which can differ
            raise ChatTemplateError(
                f"model.eos_token {options.eos_token!r} could not be set on this tokenizer"
            )
    if model is not None:
        sync_eos(model, tokenizer)


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """The id of `token` if it is one token of the vocabulary, else a `ChatTemplateError`."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        specials = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special})
        raise ChatTemplateError(
            f"model.eos_token {token!r} is not one token of this tokenizer (it encodes to {len(ids)} "
            f"tokens); its special tokens are {', '.join(map(repr, specials)) or 'none'}"
        )
    return int(ids[0])


def eos_ids(model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos id first, then the ids the model's generation config already stops at."""
    ids = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    config = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in [config] if isinstance(config, int) else config or []:
        if int(i) not in ids:
            ids.append(int(i))
    return ids


def sync_eos(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make `model.generation_config.eos_token_id` stop at the tokenizer's eos as well as at the ids
    it had (one int when there is one id, as transformers writes it)."""
    ids = eos_ids(model, tokenizer)
    config = getattr(model, "generation_config", None)
    if config is None or not ids:
        return
    config.eos_token_id = ids[0] if len(ids) == 1 else ids
    if config.pad_token_id is None and tokenizer.pad_token_id is not None:
        config.pad_token_id = int(tokenizer.pad_token_id)  # else generate() warns on every call


def require_chat_template(tokenizer: PreTrainedTokenizerBase, name: str | Path) -> None:
    """Refuse, in one line naming the option, a tokenizer that cannot render chats."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"the tokenizer of {str(name)!r} has no chat template; set model.chat_template "
            f"(a Jinja file, or one of {', '.join(TEMPLATES)}; on a stage command "
            f"--model.chat_template) to say how conversations are rendered"
        )


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of the tokenizer's special tokens (named ones and added tokens marked special)."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    return ids | {int(i) for i, t in tokenizer.added_tokens_decoder.items() if t.special}


def turn_end_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The special token the chat template puts right after an assistant message (`<|im_end|>`
    for ChatML, `<|eot_id|>` for Llama 3), or None when it puts none there."""
    mark = "Zq9Xq"  # text no template adds or rewrites
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses these roles: nothing to check
        return None
    if not isinstance(text, str) or mark not in text:
        return None
    rest = text[text.rindex(mark) + len(mark) :].lstrip(" ")
    names = sorted(
        (tokenizer.convert_ids_to_tokens(i) for i in special_ids(tokenizer)), key=len, reverse=True
    )
    return next((t for t in names if t and rest.startswith(t)), None)


def marked_text(
    tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], specials: set[int] | None = None
) -> str:
    """The completion as it was generated: special tokens kept, each shown as ⟨token⟩, so a
    reader sees the `<|im_end|>` that skip_special_tokens would hide."""
    specials = special_ids(tokenizer) if specials is None else specials
    out, run = [], []
    for i in token_ids:
        if int(i) in specials:
            if run:
                out.append(tokenizer.decode(run))
                run = []
            out.append(f"{MARK_OPEN}{tokenizer.convert_ids_to_tokens(int(i))}{MARK_CLOSE}")
        else:
            run.append(int(i))
    if run:
        out.append(tokenizer.decode(run))
    return "".join(out)


def shown_completion(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], stop_reason: str) -> str:
    """A completion as eval examples and RL rollouts show it: `marked_text` without the stop token
    it ended on (its stop reason says that), so only special tokens it ran past are marked."""
    return marked_text(tokenizer, token_ids[:-1] if stop_reason == "eos" else token_ids)


def unstopped_specials(
    tokenizer: PreTrainedTokenizerBase, completions: Iterable[tuple[Sequence[int], str]]
) -> Counter[str]:
    """token -> how many completions hold that special token somewhere it did not stop generation.

    completions: (token ids, stop reason) pairs. A stop id can only be a completion's last token,
    with reason "eos"; every other special token in a completion was generated and decoding went
    on past it."""
    specials = special_ids(tokenizer)
    found: Counter[str] = Counter()
    for ids, reason in completions:
        body = list(ids[:-1]) if reason == "eos" else list(ids)
        for i in {int(i) for i in body if int(i) in specials}:
            found[tokenizer.convert_ids_to_tokens(i)] += 1
    return found


KEEPS_EMITTING = 0.5
"""Share of completions from which a special token other than the template's end of turn counts
as one the model keeps emitting (below it, an undertrained model's stray special tokens)."""


def stop_warning(
    tokenizer: PreTrainedTokenizerBase, found: Counter[str], n: int, stop_ids: Sequence[int]
) -> str | None:
    """The one line that names an end-of-turn mismatch, or None.

    found: `unstopped_specials` over n completions; stop_ids: the ids generation stops at. The
    template's end of turn named in any completion is a mismatch (it should have stopped there);
    another special token is named when at least `KEEPS_EMITTING` of the completions hold it, and
    never the padding, bos or unk token (no turn ends with those)."""
    if not found:
        return None
    stops = " or ".join(repr(tokenizer.convert_ids_to_tokens(int(i))) for i in stop_ids) or "no token"
    turn_end = turn_end_token(tokenizer)
    if turn_end in found:
        return (
            f"{found[turn_end]} of {n} completions contain {turn_end!r} (the chat template's end of turn) "
            f"but generation stops only at {stops}; set model.eos_token: {turn_end!r}"
        )
    never = {tokenizer.pad_token, tokenizer.bos_token, tokenizer.unk_token}
    frequent = [(t, c) for t, c in found.most_common() if t not in never and c >= KEEPS_EMITTING * n]
    if not frequent:
        return None
    token, count = frequent[0]
    return (
        f"{count} of {n} completions contain the special token {token!r} but generation stops only "
        f"at {stops}; if it ends the answer, set model.eos_token: {token!r}"
    )


def template_warning(tokenizer: PreTrainedTokenizerBase, stop_ids: Sequence[int]) -> str | None:
    """Before any sampling: the template ends turns with a special token generation does not stop at."""
    turn_end = turn_end_token(tokenizer)
    if turn_end is None or tokenizer.convert_tokens_to_ids(turn_end) in set(stop_ids):
        return None
    stops = " or ".join(repr(tokenizer.convert_ids_to_tokens(int(i))) for i in stop_ids)
    return (
        f"the chat template ends each turn with {turn_end!r} but generation stops only at {stops}: "
        f"a trained model will not stop after its answer; set model.eos_token: {turn_end!r}"
    )
