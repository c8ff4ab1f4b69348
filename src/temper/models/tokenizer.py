"""A byte-level tokenizer built locally with the `tokenizers` library, with a chat template.

Why byte-level with no merges: the built-in tiny models learn arithmetic, where one token per
digit helps, and a byte vocabulary covers any text a user passes without an unknown token.
Token id i is byte i, so ids are readable in tests. Saved with `save_pretrained`, it reloads
through `AutoTokenizer` like any hub tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temper.data.formats import ROLES

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, *(f"<|{r}|>" for r in ROLES)]

# Each turn is `<|role|>content<|end|>`. The `{% generation %}` markers let
# `apply_chat_template(return_assistant_tokens_mask=True)` mark assistant tokens; our own
# masking (temper.data.chat) does not rely on them, so hub templates without markers work too.
#
# Tool calls follow the Hugging Face convention (https://huggingface.co/docs/transformers/chat_extras):
# `apply_chat_template(messages, tools=[json schemas])` lists the tools in the system turn, an
# assistant message's `tool_calls` ({"type": "function", "function": {"name", "arguments"}}) are
# written after its content as Hermes/Qwen2.5 write them, `<tool_call>{"name": ..., "arguments":
# {...}}</tool_call>` (what `temper.tools.calls.parse_tool_calls` reads back), and a `tool` result
# is its own `<|tool|>...<|end|>` turn. Without `tools` and `tool_calls` a conversation renders
# exactly as `CHAT_TEMPLATE_V1` (the template before tool support) rendered it, token for token.
_TOOLS_SYSTEM = (
    "{% if tools %}<|system|>"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n<tools>\\n' }}{% for t in tools %}{{ (t | tojson) + '\\n' }}{% endfor %}"
    '{{ \'</tools>\\nTo call a tool, write <tool_call>{"name": <tool name>, "arguments": {<arguments>}}'
    "</tool_call>; its result comes back in a tool turn.' }}<|end|>{% endif %}"
)
_TOOL_CALLS = (
    "{% for c in m['tool_calls'] or [] %}"
    "{% set f = c['function'] if c['function'] is defined else c %}"
    "{% if m['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>{{ '{\"name\": ' }}{{ f['name'] | tojson }}{{ ', \"arguments\": ' }}"
    "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ (f['arguments'] or {}) | tojson }}{% endif %}"
    "{{ '}' }}</tool_call>"
    "{% endfor %}"
)
CHAT_TEMPLATE = (
    _TOOLS_SYSTEM + "{% for m in messages %}"
    f"{{% if m['role'] not in {list(ROLES)} %}}"
    "{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "{% if not (tools and loop.first and m['role'] == 'system') %}"
    "<|{{ m['role'] }}|>"
    "{% if m['role'] == 'assistant' %}{% generation %}"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}" + _TOOL_CALLS + "<|end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|end|>{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

CHAT_TEMPLATE_V1 = (
    "{% for m in messages %}"
    f"{{% if m['role'] not in {list(ROLES)} %}}"
    "{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|>"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""The built-in template as tokenizers saved before tool support hold it (checkpoints/tiny-base):
it renders every conversation without tools as `CHAT_TEMPLATE` does, and ignores `tools` and
`tool_calls` (set `model.chat_template: temper` to give such a tokenizer the tool-aware one)."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map, the alphabet `ByteLevel` uses."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in tokenizer: 256 byte tokens, then the special tokens (ids 256..262)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tokenizer_mismatch(student, teacher) -> str:
    """'' when the two tokenizers give every token the same id (same vocabulary, same special
    tokens), else the first difference found, in words."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if len(a) != len(b):
        return f"vocabularies of {len(a)} and {len(b)} tokens"
    if a != b:
        token = next(t for t in sorted(a) if a[t] != b.get(t))
        return f"token {token!r} is id {a[token]} for the student and {b.get(token)} for the teacher"
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return f"{name} {getattr(student, name)} vs {getattr(teacher, name)}"
    return ""
