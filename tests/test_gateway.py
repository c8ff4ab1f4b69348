"""The OpenAI-compatible gateway (`temper.gateway`, `task: gateway`): the official `openai` client
against it, token ids recorded, tool calls both ways, history rewrites counted as new segments
(in training: rows of their own, never a re-tokenisation), agent scripts that crash or hang
attributed, and GRPO through an unmodified agent script."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import openai
import pytest
import torch

from fakes import Script
from temper.catalog import make_recipe_task
from temper.gateway.openai_format import split_tool_calls
from temper.gateway.recording import Recorder
from temper.gateway.server import GatewayServer
from temper.rollout.loop import EpisodeLimits, run_episodes

START = Path(__file__).parent / "pinned" / "start"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def replies(text, j):
    """The scripted policy: call the tool until a tool turn answered, then answer."""
    return "The sum is 5." if "<|tool|>" in text else CALL


@pytest.fixture
def served(tokenizer):
    recorder = Recorder(Script(tokenizer, replies), tokenizer, max_new_tokens=96)
    with GatewayServer(recorder) as server:
        yield recorder, server


def client(server, episode):
    return openai.OpenAI(base_url=server.base_url(episode), api_key="x", max_retries=0, timeout=30)


def test_a_chat_completion_returns_the_text_and_records_its_token_ids(served, tokenizer):
    recorder, server = served
    r = client(server, "ep1").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=96, logprobs=True
    )
    [row] = recorder.trajectories("ep1")
    prompt, turn = row.segments
    assert r.choices[0].message.content is None and r.choices[0].message.tool_calls  # all a call
    extra = r.model_extra | r.choices[0].model_extra
    assert extra["prompt_token_ids"] == prompt.token_ids and prompt.logprobs is None and not prompt.trainable
    assert extra["token_ids"] == turn.token_ids and turn.trainable
    assert [t.logprob for t in r.choices[0].logprobs.content] == turn.logprobs
    assert tokenizer.decode(turn.token_ids, skip_special_tokens=True) == CALL
    assert r.usage.completion_tokens == len(turn.token_ids)


def test_a_tool_call_round_trip_extends_the_episodes_row(served, tokenizer):
    """The model's <tool_call> text comes back as OpenAI tool_calls; the agent's usual next call
    (the assistant message it got, then the tool's result) extends the same row: the tool turn
    is an environment segment, the answer a second policy segment."""
    recorder, server = served
    c = client(server, "ep2")
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    r = c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    [call] = msg.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
    messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    r2 = c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert r2.choices[0].message.content == "The sum is 5." and not r2.choices[0].message.tool_calls
    [row] = recorder.trajectories("ep2")
    assert [s.trainable for s in row.segments] == [False, True, False, True]
    assert recorder.new_segments == 0
    ids = [t for s in row.segments for t in s.token_ids]
    assert ids[: len(r2.model_extra["prompt_token_ids"])] == r2.model_extra["prompt_token_ids"]
    assert "<|tool|>5" in tokenizer.decode(row.segments[2].token_ids)
    assert '"name": "add"' in tokenizer.decode(row.prompt_ids)  # the tools reached the prompt


def test_a_call_that_rewrites_history_starts_a_new_counted_row(served):
    recorder, server = served
    c = client(server, "ep3")
    first = [{"role": "user", "content": "What is 2 + 3?"}]
    r = c.chat.completions.create(model="m", messages=first, tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    rewritten = [
        {"role": "user", "content": "Summary: the user wants 2 + 3."},  # a compacted history
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    c.chat.completions.create(model="m", messages=rewritten, tools=TOOLS)
    rows = recorder.trajectories("ep3")
    assert len(rows) == 2 and recorder.new_segments == 1
    assert [s.trainable for s in rows[1].segments] == [False, True]  # its own prompt, nothing reused
    episode = recorder.trajectory("ep3")  # as one Trajectory, the trainer's form
    assert [r.segments for r in episode.rows] == [
        rows[0].segments,
        [replace(rows[1].segments[0], starts_row=True), rows[1].segments[1]],
    ]
    assert episode.completion_ids == rows[0].completion_ids + rows[1].completion_ids


def test_text_completions_and_bad_requests(served):
    recorder, server = served
    c = client(server, "ep4")
    r = c.completions.create(model="m", prompt="2 + 3 =", max_tokens=8)
    [row] = recorder.trajectories("ep4")
    assert r.choices[0].text and r.choices[0].model_extra["token_ids"] == row.segments[1].token_ids
    with pytest.raises(openai.BadRequestError, match="non-empty list"):
        c.chat.completions.create(model="m", messages=[])
    with pytest.raises(openai.BadRequestError, match="streaming"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    assert [m.id for m in c.models.list()] == ["temper-policy"]


# ---------------------------------------------------------------------------------------------
# the agent script as an episode (task: gateway)

AGENT = '''
"""An agent written against the openai client only: it knows nothing of temper."""
import json, os, sys
from openai import OpenAI

row = json.loads(sys.stdin.readline())
if row.get("how") == "crash":
    raise RuntimeError("the agent blew up")
if row.get("how") == "hang":
    import time
    time.sleep(600)
client = OpenAI(max_retries=0)
tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                         "required": ["a", "b"]}}}]
messages = [{"role": "user", "content": row["prompt"]}]
for k in range(3):
    r = client.chat.completions.create(model="policy", messages=messages, tools=tools, max_tokens=48)
    msg = r.choices[0].message
    if os.environ.get("AGENT_LOG"):
        with open(os.environ["AGENT_LOG"], "a") as f:
            calls = [[c.function.name, json.loads(c.function.arguments)] for c in msg.tool_calls or []]
            f.write(json.dumps({"content": msg.content, "calls": calls}) + "\\n")
    messages.append(msg.model_dump(exclude_none=True))
    if msg.tool_calls:
        for c in msg.tool_calls:
            a = json.loads(c.function.arguments)
            messages.append({"role": "tool", "tool_call_id": c.id, "content": str(a.get("a", 0) + a.get("b", 0))})
    elif row.get("how") == "rewrite" and k == 0:
        messages = [{"role": "user", "content": "Start again: " + row["prompt"]}]
    elif k == 0:
        messages.append({"role": "user", "content": "Check it with the add tool."})
    else:
        break
'''

REWARD = """
def says_answer(completions, answer, **kw):
    return [float(str(a) in (c if isinstance(c, str) else c[-1]["content"])) for c, a in zip(completions, answer)]
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "rewards.py").write_text(REWARD)
    rows = [
        {"prompt": "What is 2 + 3?", "answer": "5", "how": how}
        for how in ("fine", "crash", "hang", "rewrite")
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("AGENT_LOG", str(tmp_path / "agent.log"))
    return tmp_path


def gateway_task(folder, **options):
    entry = {
        "task": "gateway",
        "agent": "agent.py",
        "data": "rows.jsonl",
        "rewards": ["rewards.py:says_answer"],
        "split_column": None,
        "test_fraction": 0.01,
        "agent_timeout": 20,
    } | options
    return make_recipe_task("adder", entry, base_dir=folder)


def problems(task):
    return {p.data["row"]["how"]: p for split in ("train", "test") for p in task._splits[split]}


def test_an_openai_client_agent_with_a_tool_is_an_episode_token_for_token(folder, tokenizer):
    """The agent's calls are the episode's turns: the model's tool call reaches the agent as
    OpenAI tool_calls, its tool result comes back as the environment's tokens, and every policy
    segment is exactly the text the agent was served; the reward function grades the end."""
    t = gateway_task(folder)
    script = Script(tokenizer, replies)
    [[episode]] = run_episodes(
        script, tokenizer, [[t.make_env(problems(t)["fine"])]], [0], EpisodeLimits(max_new_tokens=96)
    )
    assert episode.stop_reason == "done", episode.error
    assert episode.turns == 2 and episode.score.reward == 1.0
    log = [json.loads(x) for x in (folder / "agent.log").read_text().splitlines()]
    assert log == [
        {"content": None, "calls": [["add", {"a": 2, "b": 3}]]},
        {"content": "The sum is 5.", "calls": []},
    ]
    policy = [s for s in episode.segments if s.trainable]
    for seg, seen in zip(policy, log, strict=True):
        text = tokenizer.decode(seg.token_ids, skip_special_tokens=True)
        content, calls = split_tool_calls(text)
        assert content == seen["content"]
        assert [[c["function"]["name"], json.loads(c["function"]["arguments"])] for c in calls] == seen[
            "calls"
        ]
        assert seg.logprobs == [-(k + 1) / 100 for k in range(len(seg.token_ids))]  # the sampler's, verbatim
    assert "<|tool|>5<|end|>" in tokenizer.decode(episode.segments[2].token_ids)
    assert '"name": "add"' in tokenizer.decode(episode.prompt_ids)  # the agent's tools, rendered


def test_crashing_hanging_and_rewriting_agents_are_attributed_and_never_hang_the_batch(folder, tokenizer):
    # the interpreter and `import openai` take seconds here (> 8 s at load 14 on 2 cores)
    t = gateway_task(folder, agent_timeout=20)
    ps = problems(t)
    envs = [[t.make_env(ps[how])] for how in ("fine", "crash", "hang", "rewrite")]
    script = Script(tokenizer, lambda text, j: "The sum is 5.")
    started = time.monotonic()
    fine, crash, hang, rewrite = (
        e for [e] in run_episodes(script, tokenizer, envs, [0, 1, 2, 3], EpisodeLimits())
    )
    assert time.monotonic() - started < 90  # the hung agent was killed at its 20 s, not waited for
    assert fine.stop_reason == "done" and fine.turns == 2 and fine.score.reward == 1.0, fine.error
    assert crash.stop_reason == "env_error"
    assert crash.error.startswith(
        f"agent agent.py exited with status 1 on problem {ps['crash'].id}; stderr: "
    )
    assert "RuntimeError: the agent blew up" in crash.error
    assert hang.stop_reason == "env_error"
    assert "agent agent.py made no call and did not exit within 20 s (killed)" in hang.error
    # the rewrite: the call that does not extend the row starts a second one; the episode goes on
    assert rewrite.stop_reason == "done" and rewrite.turns == 2 and rewrite.score.reward == 1.0
    assert len(rewrite.rows) == 2 and len(fine.rows) == 1


def test_bad_gateway_options_are_refused_naming_the_option(folder):
    from temper.tasks.base import TaskOptionError

    with pytest.raises(TaskOptionError, match="agent script nope.py not found") as err:
        gateway_task(folder, agent="nope.py")
    assert err.value.option == ("agent",)
    with pytest.raises(TaskOptionError, match="needs `agent`"):
        gateway_task(folder, agent=None)
    with pytest.raises(TaskOptionError, match="drop `env`") as err:
        gateway_task(folder, env="envs.py:make_env")
    assert err.value.option == ("env",)


@pytest.mark.slow
def test_grpo_trains_an_unmodified_agent_through_the_gateway(folder, tokenizer):
    """Three GRPO steps of the pinned tiny model (with the tool-aware template) on the agent
    script: the rl stage runs the agent once per sample, its calls are multi-turn episodes, and
    the tokens it trained on are the texts the agent was served."""
    from temper.recipe import parse_recipe
    from temper.runner import run_recipe

    (folder / "rows.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"What is {a} + 3?", "answer": str(a + 3), "how": "fine"}) + "\n"
            for a in range(6)
        )
    )
    text = f"""name: gw
model: {{path: {START}, chat_template: temper}}
tasks:
  adder: {{task: gateway, agent: agent.py, data: rows.jsonl, rewards: [rewards.py:says_answer], test_fraction: 0.2}}
stages:
  - kind: rl
    tasks: [adder]
    train: {{steps: 3, prompts_per_step: 2, group_size: 2, max_new_tokens: 24, max_turns: 3}}
"""
    (folder / "r.yaml").write_text(text)
    run = run_recipe(parse_recipe(text, "r.yaml", base_dir=folder), folder, folder / "run", text)
    [stage] = [p for p in run.iterdir() if p.name.endswith("rl")]
    metrics = [json.loads(x) for x in (stage / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "signal/gateway_calls" in m]
    assert len(steps) == 3 and all(m["signal/gateway_calls"] > 0 for m in steps)
    assert [(m["gateway/rewrites"], m["gateway/segments_per_episode"]) for m in steps] == [(0, 1.0)] * 3
    rollouts = [json.loads(x) for x in (stage / "rollouts.jsonl").read_text().splitlines()]
    served = {json.dumps(x) for x in (json.loads(y) for y in (folder / "agent.log").read_text().splitlines())}
    trained = set()
    for r in rollouts:
        for seg in r.get("episode") or [{"by": "policy", "text": r["completion"]}]:
            if seg["by"] == "policy":
                content, calls = split_tool_calls(seg["text"].removesuffix("<|end|>"))
                calls = [[c["function"]["name"], json.loads(c["function"]["arguments"])] for c in calls]
                trained.add(json.dumps({"content": content, "calls": calls}))
    assert trained and trained <= served


def test_serve_a_saved_model_and_the_gateway_command(tmp_path, tokenizer, nano):
    """`temper.gateway.serve(model)` serves a saved model (its HFSampler) and records the call;
    `temper gateway --model DIR --port N` parses to it."""
    import temper.gateway
    from temper.cli import build_parser, cmd_gateway
    from temper.models import save_model

    save_model(nano, tokenizer, tmp_path / "m")
    with temper.gateway.serve(tmp_path / "m", max_new_tokens=8) as gw:
        c = openai.OpenAI(base_url=gw.base_url("e"), api_key="x", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], seed=3)
        [row] = gw.recorder.trajectories("e")
        assert r.choices[0].model_extra["token_ids"] == row.segments[1].token_ids
        assert 0 < len(row.segments[1].token_ids) <= 8 and all(lp <= 0 for lp in row.segments[1].logprobs)
    args = build_parser().parse_args(["gateway", "--model", str(tmp_path / "m"), "--port", "0"])
    assert (args.func, args.port, args.max_new_tokens) == (cmd_gateway, 0, 256)


def test_the_episode_is_named_by_path_header_or_user_field(served):
    recorder, server = served
    plain = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0, timeout=30)
    hi = [{"role": "user", "content": "hi"}]
    plain.chat.completions.create(model="m", messages=hi, user="by-user")
    plain.chat.completions.create(model="m", messages=hi, extra_headers={"X-Temper-Episode": "by-header"})
    client(server, "by-path").chat.completions.create(model="m", messages=hi, user="ignored")
    assert sorted(recorder.episodes) == ["by-header", "by-path", "by-user"]


def test_a_training_episode_takes_one_call_at_a_time():
    """A second call while one waits for its turn is refused (409), not interleaved into the row;
    a call still waiting when the episode closes is told it is over (410)."""
    import threading

    from temper.gateway.bridge import Bridge

    bridge = Bridge("p")
    with GatewayServer(bridge) as server:
        c = client(server, "e")
        errors = []

        def first():
            try:
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            except openai.APIStatusError as err:
                errors.append(err.status_code)

        t = threading.Thread(target=first)
        t.start()
        assert bridge.next_call(10) is not None  # the first call is with the env now
        with pytest.raises(openai.ConflictError, match="one call at a time"):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        bridge.close()
        t.join(10)
        assert errors == [410]


# ---------------------------------------------------------------------------------------------
# an agent that rewrites its history: a second training row, never a re-tokenisation

REWRITER = '''
"""An agent that compacts its history when the first answer says 5: its second call drops the
system turn and summarises the question, so its prompt does not extend what was sampled."""
import json, sys
from openai import OpenAI

row = json.loads(sys.stdin.readline())
client = OpenAI(max_retries=0)
messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": row["prompt"]}]
first = client.chat.completions.create(model="policy", messages=messages, max_tokens=48).choices[0].message
if "5" in (first.content or ""):
    messages = [{"role": "user", "content": "Summary: " + row["prompt"]}, first.model_dump(exclude_none=True)]
else:
    messages.append(first.model_dump(exclude_none=True))
messages.append({"role": "user", "content": "Are you sure?"})
client.chat.completions.create(model="policy", messages=messages, max_tokens=48)
'''


def second_thoughts(text, j):
    """Sample 0 answers 5 (its agent then rewrites its history), sample 1 answers 7 (extended);
    asked again, each stands by its first answer: rewards 1 and 0."""
    if "Are you sure?" in text:
        return "Yes, 5." if "It is 5." in text else "Yes, 7."
    return "It is 5." if j == 0 else "It is 7."


def test_a_rewritten_history_is_a_second_row_with_the_episodes_advantage(folder, tokenizer):
    """The rewriting episode is two rows: the first call's row, and a row whose prompt is the
    compacted history (the model's first answer in it as prompt text, never trained on again);
    the batch trains exactly the sampled turns, both rows get the episode's advantage, the group
    statistics are of its two episodes, and the step's metrics count one rewrite."""
    from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
    from temper.train.rl_metrics import episode_metrics
    from temper.train.rollouts import grade_episodes, rollout_record, to_batch

    (folder / "rewriter.py").write_text(REWRITER)
    t = gateway_task(folder, agent="rewriter.py")
    problem = problems(t)["fine"]
    [[rewrote, extended]] = run_episodes(
        Script(tokenizer, second_thoughts),
        tokenizer,
        [[t.make_env(problem), t.make_env(problem)]],
        [0],
        EpisodeLimits(max_new_tokens=96),
    )
    assert (rewrote.stop_reason, extended.stop_reason) == ("done", "done"), rewrote.error
    assert (len(rewrote.rows), len(extended.rows)) == (2, 1) and rewrote.turns == extended.turns == 2
    first, second = rewrote.rows
    assert [s.trainable for s in second.segments] == [False, True] and second.segments[0].starts_row
    assert "Summary: What is 2 + 3?" in tokenizer.decode(second.prompt_ids)
    assert "It is 5." in tokenizer.decode(second.prompt_ids)  # the first answer, re-rendered as prompt

    group = grade_episodes(problem, [rewrote, extended], {"outcome": 1.0}, 96, 0)
    assert group.rewards == [1.0, 0.0]
    batch = to_batch([group])
    assert batch.episode_R.tolist() == [0, 0, 1] and batch.rewards_G_N.tolist() == [[1.0, 0.0]]
    assert batch.prompts[1] == second.prompt_ids
    sampled = [s.token_ids for s in rewrote.segments + extended.segments if s.trainable]
    trained = [batch.completions_R_T[r][batch.mask_R_T[r]].tolist() for r in range(3)]
    assert trained[0] == sampled[0] and trained[1] == sampled[1] and trained[2] == sampled[2] + sampled[3]
    assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in trained[:2]] == ["It is 5.", "Yes, 5."]
    logprobs = [batch.old_logprobs_R_T[r][batch.mask_R_T[r]].tolist() for r in range(2)]
    assert logprobs == [pytest.approx(s.logprobs) for s in rewrote.segments if s.trainable]

    a = ESTIMATORS["grpo"](AdvantageInputs(batch.rewards_G_N, batch.mask_R_T, episode_R=batch.episode_R))[0]
    per_row = [float(a[r][batch.mask_R_T[r]].unique()) for r in range(3)]
    assert per_row == pytest.approx([0.7071, 0.7071, -0.7071], abs=1e-4)  # (1 - 0.5) / std of 2 episodes

    metrics = episode_metrics([rewrote, extended])
    assert metrics["gateway/rewrites"] == 1 and metrics["gateway/segments_per_episode"] == 1.5
    [record, _] = rollout_record(1, group, tokenizer)
    assert record["rows"] == 2 and [s["row"] for s in record["episode"]] == [0, 1, 1]
    assert [s.get("row_start", False) for s in record["episode"]] == [False, True, False]


@pytest.mark.slow
def test_grpo_trains_through_an_agent_that_rewrites_its_history(folder, tokenizer, nano):
    """Three GRPO steps on the rewriting agent: every group has one two-row episode, the metrics
    count its rewrite, rollouts.jsonl marks the rows, and the policy trains."""
    from temper.train.rl import RLConfig, train_rl

    (folder / "rewriter.py").write_text(REWRITER)
    questions = ["What is 2 + 3?", "What is 1 + 4?", "What is 0 + 5?", "What is 4 + 1?", "What is 3 + 2?"]
    (folder / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": q, "answer": "5"}) + "\n" for q in questions)
    )
    t = gateway_task(folder, agent="rewriter.py", test_fraction=0.2)
    before = [p.detach().clone() for p in nano.parameters()]
    config = RLConfig(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=24, max_turns=3, lr=1e-2,
                      seed=0, progress=False, rewards={"outcome": 1.0}, log_rollouts=2)  # fmt: skip
    result = train_rl(
        nano, tokenizer, [t], config, folder / "run", sampler=Script(tokenizer, second_thoughts)
    )
    assert [row["gateway/rewrites"] for row in result.history] == [2, 2, 2]
    assert [row["gateway/segments_per_episode"] for row in result.history] == [1.5, 1.5, 1.5]
    assert all(row["reward"] == 0.5 and row["loss"] == row["loss"] for row in result.history)  # finite
    assert any(not torch.equal(b, p) for b, p in zip(before, nano.parameters()))
    rollouts = [json.loads(x) for x in (folder / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r.get("rows", 1) for r in rollouts) == [1] * 6 + [2] * 6
    metrics = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["gateway/rewrites"] for m in metrics] == [2, 2, 2]
