"""Tool-call SFT (issue 9 item 3): the built-in templates render tools and tool calls in the HF
convention without changing any rendering without them, TRL-format tool rows validate, and
the masks train on assistant turns (tool-call text included) and never on tool results."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from temper.data.chat import IGNORE, TemplateError, check_tool_template, prompt_ids, tokenize_example
from temper.data.formats import DataError, load_rows, parse_row
from temper.envs.tool_env import ToolEnv
from temper.models.chat import TEMPLATES
from temper.models.tokenizer import CHAT_TEMPLATE, CHAT_TEMPLATE_V1
from temper.tools.calls import ToolRegistry, parse_tool_calls

ROOT = Path(__file__).parents[1]
SHIPPED = ROOT / "checkpoints" / "tiny-base" / "model"

# ChatML as models/chat.py had it before tool support
CHATML_V1 = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

S, U, A, T = (
    {"role": r, "content": c} for r, c in [("system", "S"), ("user", "u"), ("assistant", "a"), ("tool", "t")]
)
CONVERSATIONS = [
    [U],
    [S],
    [U, A],
    [S, U, A],
    [S, U, A, T, A, U, A],
    [U, A, T, T, A],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": " x\n"}],
    [{"role": "system", "content": "two\nlines"}, {"role": "user", "content": "{{ not jinja }}"}, A],
]

ADD_CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def _with(tokenizer, template):
    """A copy of `tokenizer` with another chat template (the session fixture stays as it is)."""
    out = copy.deepcopy(tokenizer)
    out.chat_template = template
    return out


@pytest.mark.parametrize(("name", "old"), [("temper", CHAT_TEMPLATE_V1), ("chatml", CHATML_V1)])
def test_renderings_without_tools_are_unchanged_token_for_token(tokenizer, name, old):
    new, before = _with(tokenizer, TEMPLATES[name]), _with(tokenizer, old)
    assert TEMPLATES[name] != old
    for messages in CONVERSATIONS:
        for gen in (False, True):
            ids = new.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=gen, return_dict=True
            )
            was = before.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=gen, return_dict=True
            )
            assert ids["input_ids"] == was["input_ids"], (name, messages, gen)
            # tools=None and tools=[] (as data.chat passes it) change nothing either
            assert prompt_ids(new, messages, tools=[]) == prompt_ids(before, messages)
    if name == "temper":
        with pytest.raises(Exception, match="unknown role: robot"):
            new.apply_chat_template([{"role": "robot", "content": "x"}])


def test_the_shipped_base_tokenizer_keeps_working_and_is_told_to_upgrade_for_tools(tokenizer):
    shipped = AutoTokenizer.from_pretrained(SHIPPED)
    assert shipped.chat_template == CHAT_TEMPLATE_V1  # saved before tool support
    assert tokenizer.chat_template == CHAT_TEMPLATE == TEMPLATES["temper"]  # new tokenizers: with tools
    for messages in CONVERSATIONS:
        assert prompt_ids(shipped, messages) == prompt_ids(tokenizer, messages)
    with pytest.raises(TemplateError, match="does not render `tools`.*model.chat_template: temper"):
        check_tool_template(shipped)
    shipped.chat_template = TEMPLATES["temper"]  # what `model.chat_template: temper` does
    check_tool_template(shipped)
    check_tool_template(_with(tokenizer, TEMPLATES["chatml"]))


def _segments(tokenizer, parts):
    """(ids, labels) expected from (text, trained) parts; the byte tokenizer encodes each exactly."""
    ids, labels = [], []
    for text, trained in parts:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
    return ids, labels


CALL_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_masks_on_a_three_turn_tool_conversation_token_by_token(tokenizer):
    """user -> assistant (tool call) -> tool result -> assistant: both assistant turns, the
    tool-call text and their end tokens are trained; the result and the headers never."""
    row = {
        "messages": [
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
            {"role": "tool", "name": "add", "content": "5"},
            {"role": "assistant", "content": "It is 5."},
        ]
    }
    tok = tokenize_example(tokenizer, parse_row(row, "x", 1), 512)
    want_ids, want_labels = _segments(
        tokenizer,
        [
            ("<|user|>2+3?<|end|><|assistant|>", False),
            (CALL_TEXT + "<|end|>", True),
            ("<|tool|>5<|end|><|assistant|>", False),
            ("It is 5.<|end|>", True),
        ],
    )
    assert tok.input_ids == want_ids
    assert tok.labels == want_labels
    # what the model learns to write is what parse_tool_calls reads back
    trained = tokenizer.decode([t for t in tok.labels if t != IGNORE])
    assert [(c.name, c.arguments) for c in parse_tool_calls(trained)] == [("add", {"a": 2, "b": 3})]


def test_tools_are_in_the_untrained_system_part_and_content_precedes_calls(tokenizer):
    schema = ToolRegistry([add]).schemas
    row = {
        "messages": [
            {"role": "system", "content": "Be exact."},
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "Adding.", "tool_calls": [ADD_CALL, ADD_CALL]},
            {"role": "tool", "content": "5"},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "5"},
        ],
        "tools": json.dumps(schema),  # TRL's datasets store the schemas as a JSON string
    }
    tok = tokenize_example(tokenizer, parse_row(row, "x", 1), 4096)
    system = (
        "<|system|>Be exact.\n\n# Tools\n<tools>\n" + json.dumps(schema[0]) + "\n</tools>\n"
        'To call a tool, write <tool_call>{"name": <tool name>, "arguments": {<arguments>}}</tool_call>; '
        "its result comes back in a tool turn.<|end|>"
    )
    want = _segments(
        tokenizer,
        [
            (system + "<|user|>2+3?<|end|><|assistant|>", False),
            ("Adding.\n" + CALL_TEXT + "\n" + CALL_TEXT + "<|end|>", True),
            ("<|tool|>5<|end|><|tool|>5<|end|><|assistant|>", False),
            ("5<|end|>", True),
        ],
    )
    assert (tok.input_ids, tok.labels) == want


def test_chatml_renders_calls_as_qwen_and_trains_on_them(tokenizer):
    chatml = _with(tokenizer, TEMPLATES["chatml"])
    row = {
        "messages": [
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "tool_calls": [ADD_CALL]},  # no content at all
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "5"},
        ]
    }
    tok = tokenize_example(chatml, parse_row(row, "x", 1), 512)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    want = _segments(
        chatml,
        [
            ("<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n", False),
            (call + "<|im_end|>\n", True),
            ("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n", False),
            ("5<|im_end|>\n", True),
        ],
    )
    assert (tok.input_ids, tok.labels) == want
    assert parse_tool_calls(call)[0].arguments == {"a": 2, "b": 3}


def test_a_sampled_call_renders_as_the_structured_call(tokenizer):
    """The agent loop keeps the policy's text as the assistant content; the template renders a
    structured `tool_calls` turn to the same tokens, so SFT data and RL episodes agree."""
    for template in (TEMPLATES["temper"], TEMPLATES["chatml"]):
        tok = _with(tokenizer, template)
        text = tok.apply_chat_template(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
            ],
            tokenize=False,
        )
        sampled = "\n".join(c.text for c in parse_tool_calls(text))
        plain = tok.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": sampled}], tokenize=False
        )
        assert plain == text


def test_trl_tool_rows_load_from_a_file(tmp_path, tokenizer):
    rows = [
        {
            "messages": [
                {"role": "user", "content": "2+3?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
                    ],
                },
                {"role": "tool", "name": "add", "content": "5"},
                {"role": "assistant", "content": "5"},
            ],
            "tools": ToolRegistry([add]).schemas,
        }
    ]
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples, report = load_rows(path)
    assert report.skipped == 0 and examples[0].tools == rows[0]["tools"]
    tok = tokenize_example(tokenizer, examples[0], 4096)
    trained = tokenizer.decode([t for t in tok.labels if t != IGNORE])
    assert trained == CALL_TEXT + "<|end|>5<|end|>"


U_ = {"role": "user", "content": "q"}


def _call_row(call, content=""):
    return {"messages": [U_, {"role": "assistant", "content": content, "tool_calls": [call]}]}


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        (_call_row("add"), "messages[1].tool_calls[0]", "must be an object, got str"),
        (
            _call_row({"type": "code", "function": {"name": "f"}}),
            "messages[1].tool_calls[0].type",
            "got 'code'",
        ),
        (_call_row({"function": "add"}), "messages[1].tool_calls[0].function", "must be an object"),
        (
            _call_row({"function": {"arguments": {}}}),
            "messages[1].tool_calls[0].function.name",
            "non-empty string",
        ),
        (_call_row({"name": ""}), "messages[1].tool_calls[0].name", "non-empty string"),
        (
            _call_row({"function": {"name": "f", "arguments": "{a: 1}"}}),
            "messages[1].tool_calls[0].function.arguments",
            "is a string but not JSON: Expecting property name",
        ),
        (
            _call_row({"function": {"name": "f", "arguments": [1]}}),
            "messages[1].tool_calls[0].function.arguments",
            "must be an object (or its JSON string), got list",
        ),
        (
            {"messages": [U_, {"role": "assistant", "content": None}]},
            "messages[1].content",
            "must be a string, got NoneType (only an assistant turn with tool_calls may have none)",
        ),
        (
            {"messages": [U_, {"role": "user", "content": None, "tool_calls": [ADD_CALL]}]},
            "messages[1].content",
            "must be a string, got NoneType",
        ),
        (
            {
                "messages": [
                    U_,
                    {"role": "assistant", "tool_calls": [ADD_CALL]},
                    {"role": "tool", "content": "5", "name": 3},
                ]
            },
            "messages[2].name",
            "must be a string",
        ),
        ({**_call_row(ADD_CALL), "tools": "[{"}, "tools", "is a string but not JSON"),
        (
            {**_call_row(ADD_CALL), "tools": {"name": "add"}},
            "tools",
            "must be a list of tool schemas, got dict",
        ),
        ({**_call_row(ADD_CALL), "tools": [{"function": {}}]}, "tools[0]", "must be a tool schema"),
    ],
)
def test_malformed_tool_rows_name_file_line_and_field(tmp_path, row, field, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_call_row(ADD_CALL)) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as err:
        load_rows(path)
    assert str(err.value).startswith(f"{path}:2: field {field!r}: "), str(err.value)
    assert problem in str(err.value)


def test_a_template_that_drops_tool_calls_is_refused_not_trained_silently(tokenizer):
    row = parse_row(_call_row(ADD_CALL, content="Adding."), "d.jsonl", 7)
    with pytest.raises(
        DataError, match=r"d.jsonl:7: field '<chat_template>': .*`tool_calls` of message 1 \('add'"
    ):
        tokenize_example(_with(tokenizer, CHAT_TEMPLATE_V1), row, 512)


def test_chatml_lists_tools_in_the_system_turn_as_qwen(tokenizer):
    chatml = _with(tokenizer, TEMPLATES["chatml"])
    schema = ToolRegistry([add]).schemas
    text = chatml.apply_chat_template([S, U], tools=schema, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(schema[0])
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call><|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    )
    alone = chatml.apply_chat_template([U], tools=schema, tokenize=False)
    assert alone.startswith("<|im_start|>system\n# Tools\n\n") and alone.endswith(
        "<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
    )


def test_an_empty_tool_list_is_no_tools(tokenizer):
    """Some templates (Llama 3.1) write their tool preamble for `tools=[]`; TRL passes None then."""
    marks = _with(
        tokenizer,
        "{% if tools is not none %}TOOLS{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}",
    )
    assert tokenizer.decode(prompt_ids(marks, [U], tools=[])) == "u"
    assert tokenizer.decode(prompt_ids(marks, [U], tools=ToolRegistry([add]).schemas)) == "TOOLSu"


def test_the_report_names_the_template_before_tool_support():
    from temper.report.models import template_name

    assert template_name(CHAT_TEMPLATE_V1).startswith("temper built-in v1, no tool-call syntax (sha256 ")
    assert template_name(CHAT_TEMPLATE).startswith("temper built-in (sha256 ")


def test_chatml_writes_content_then_each_call_on_its_own_lines(tokenizer):
    chatml = _with(tokenizer, TEMPLATES["chatml"])
    turn = {"role": "assistant", "content": "Adding.", "tool_calls": [ADD_CALL, ADD_CALL]}
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    text = chatml.apply_chat_template([U, turn], tokenize=False)
    assert text.endswith("<|im_start|>assistant\nAdding.\n" + call + "\n" + call + "<|im_end|>\n")


def test_a_prompt_completion_row_keeps_its_tools_in_the_untrained_prompt(tokenizer):
    schema = ToolRegistry([add]).schemas
    row = {
        "prompt": [{"role": "user", "content": "2+3?"}],
        "completion": [
            {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "5"},
        ],
        "tools": schema,
    }
    example = parse_row(row, "x", 1)
    assert example.tools == schema
    tok = tokenize_example(tokenizer, example, 4096)
    rendered = tokenizer.decode(tok.input_ids)
    assert rendered.startswith("<|system|># Tools\n<tools>\n" + json.dumps(schema[0]))
    assert tokenizer.decode([t for t in tok.labels if t != IGNORE]) == CALL_TEXT + "<|end|>5<|end|>"


def test_a_hub_template_with_tool_support_works_unchanged(tokenizer):
    """Qwen2.5-Instruct's template (TRL's copy): the env's tools reach its system turn, the calls
    it renders parse back, and the masks train on the call and not on the tool response."""
    trl = pytest.importorskip("trl")
    qwen = _with(tokenizer, (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text())
    env = ToolEnv([U], ToolRegistry([add]), grader=lambda answer: None)
    prompt = tokenizer.decode(prompt_ids(qwen, env.reset(), tools=env.tools))
    assert "<tools>\n" + json.dumps(env.tools[0]) + "\n</tools>" in prompt
    row = {
        "messages": [
            U,
            {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "5"},
        ]
    }
    tok = tokenize_example(qwen, parse_row(row, "x", 1), 4096)
    trained = tokenizer.decode([t for t in tok.labels if t != IGNORE])
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert trained == call + "<|im_end|>\n5<|im_end|>\n"
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(tok.input_ids)
    assert [(c.name, c.arguments) for c in parse_tool_calls(trained)] == [("add", {"a": 2, "b": 3})]


def test_chatml_tool_masks_on_a_trained_bpe_tokenizer():
    """Merges must not cross the boundaries masking relies on (data.chat refuses a template whose
    prompt tokens are not a prefix); the Qwen2-style BPE of tiny_qwen keeps them apart."""
    from tiny_qwen import build_tokenizer as build_bpe

    bpe = build_bpe()
    bpe.chat_template = TEMPLATES["chatml"]
    check_tool_template(bpe)
    row = {
        "messages": [
            {"role": "system", "content": "Be exact."},
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "Let me add.", "tool_calls": [ADD_CALL]},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "Answer: 5"},
        ],
        "tools": ToolRegistry([add]).schemas,
    }
    tok = tokenize_example(bpe, parse_row(row, "x", 1), 4096)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    trained = bpe.decode([t for t in tok.labels if t != IGNORE])
    assert trained == "Let me add.\n" + call + "<|im_end|>\nAnswer: 5<|im_end|>\n"
