"""calculator_arithmetic: the inline code tool in the sandbox, its episodes and its SFT masks."""

from __future__ import annotations

from pathlib import Path

import pytest

from temper.catalog import make_task
from temper.data.chat import IGNORE, TemplateError, mask_untrained, tokenize_example
from temper.data.formats import Example
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.sandbox import probe

needs_sandbox = pytest.mark.skipif(
    probe().tier is None, reason=f"no sandbox tier on this host: {probe().reason}"
)


@pytest.fixture
def task():
    return make_task("calculator_arithmetic", ood_digits=4)


def test_demonstration_and_the_environment_span(task):
    problem = next(p for p in task.sample("train", 20, 0) if p.data["a"] > 9)
    d = problem.data
    assert task.demonstration(problem) == (
        f"<code>print({d['a']}*{d['b']})</code><interpreter>{d['answer']}</interpreter>\nAnswer: {d['answer']}"
    )
    assert task.environment_spans(problem) == [f"<interpreter>{d['answer']}</interpreter>"]
    assert task.score(problem, task.demonstration(problem)).correct
    assert task.max_turns == 3  # two calls, then the answer
    ood = task.sample("ood", 5, 0)
    assert all(len(str(p.data["a"])) == 4 for p in ood)


def test_mental_ops_are_demonstrated_without_the_tool():
    task = make_task("calculator_arithmetic", ops=["+", "*"], mental_ops=["+"])
    add = next(p for p in task.sample("train", 50, 0) if p.data["op"] == "+")
    mul = next(p for p in task.sample("train", 50, 0) if p.data["op"] == "*")
    assert "<code>" not in task.demonstration(add) and task.environment_spans(add) == []
    assert task.demonstration(mul).startswith("<code>")
    half = make_task("calculator_arithmetic", ops=["+", "*"], mental_ops=["+"], mental_share=0.5)
    adds = [p for p in half.sample("train", 400, 0) if p.data["op"] == "+"]
    with_tool = [half.uses_tool(p) for p in adds]
    assert 0.35 < sum(with_tool) / len(with_tool) < 0.65  # about half of the + problems use the tool
    assert all(half.uses_tool(p) for p in half.sample("train", 100, 0) if p.data["op"] == "*")
    assert [half.uses_tool(p) for p in adds] == with_tool  # stable
    with pytest.raises(ValueError, match="mental_share must be in"):
        make_task("calculator_arithmetic", mental_share=1.5)
    with pytest.raises(ValueError, match="mental_ops must be a subset"):
        make_task("calculator_arithmetic", ops=["*"], mental_ops=["+"])


def test_sft_trains_on_the_code_and_answer_never_on_the_interpreter_output(task, tokenizer):
    problem = task.sample("train", 1, 3)[0]
    messages = problem.messages() + [{"role": "assistant", "content": task.demonstration(problem)}]
    spans = tuple(task.environment_spans(problem))
    tok = tokenize_example(tokenizer, Example("t", 1, messages=messages, untrained=spans), 512)
    trained = "".join(
        tokenizer.decode([t], skip_special_tokens=False)
        for t, lab in zip(tok.input_ids, tok.labels)
        if lab != IGNORE
    )
    d = problem.data
    assert trained == f"<code>print({d['a']}*{d['b']})</code>\nAnswer: {d['answer']}<|end|>"
    plain = tokenize_example(tokenizer, Example("t", 1, messages=messages), 512)
    assert plain.input_ids == tok.input_ids  # the input is unchanged; only the labels differ


def test_a_span_that_is_not_in_the_trained_tokens_is_refused(tokenizer):
    ids = tokenizer.encode("abc", add_special_tokens=False)
    with pytest.raises(TemplateError, match="cannot be left out of the loss"):
        mask_untrained(tokenizer, ids, [IGNORE, ids[1], ids[2]], ("ab",))


class Policy:
    """A scripted Sampler: replies from a list, in order, per episode (told apart by prompt)."""

    def __init__(self, tokenizer, replies):
        from tests.test_agent_loop import Script

        self.count: dict[str, int] = {}
        self.replies = replies

        def reply(text, j):
            key = text.split("<|assistant|>")[0]
            k = self.count.get(key, 0)
            self.count[key] = k + 1
            return self.replies[min(k, len(self.replies) - 1)]

        self.script = Script(tokenizer, reply)

    def sample(self, *a, **kw):
        return self.script.sample(*a, **kw)


@needs_sandbox
def test_an_episode_runs_the_code_in_the_sandbox_and_grades_the_answer(task, tokenizer):
    problem = task.sample("ood", 1, 0)[0]
    d = problem.data
    env = task.make_env(problem)
    policy = Policy(tokenizer, [f"<code>print({d['a']}*{d['b']})</code>", f"\nAnswer: {d['answer']}"])
    [[t]] = run_episodes(policy, tokenizer, [[env]], [0], EpisodeLimits(max_turns=task.max_turns))
    assert t.stop_reason == "done" and t.score.correct
    assert tokenizer.decode(t.segments[2].token_ids) == f"<interpreter>{d['answer']}</interpreter>"
    assert not t.segments[2].trainable
    assert (
        t.step_rewards == [-0.05, 0.0]
        and t.signals[0]["tool_calls"] == 1
        and t.signals[0]["tool_errors"] == 0
    )
    assert env._sandbox is None  # the workspace is gone with the episode


@needs_sandbox
def test_tool_errors_and_the_call_limit(task, tokenizer):
    problem = task.sample("test", 1, 0)[0]
    env = task.make_env(problem)
    result = env.step("<code>print(1/0)</code>")
    assert result.inline == "<interpreter>ZeroDivisionError: division by zero</interpreter>"
    assert result.signals["tool_errors"] == 1
    workspace = Path(env._sandbox.workspace)
    env.step("<code>print(1)</code>")
    over = env.step("<code>print(2)</code>")  # a third call: taken as the (unparsable) answer
    assert over.done and not over.score.parsed
    assert not workspace.exists()
    long = task.make_env(problem).step("<code>print('9' * 500)</code>")
    assert long.inline == f"<interpreter>{'9' * 64}...</interpreter>" and long.signals["tool_errors"] == 1
