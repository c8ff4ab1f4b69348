"""Generative judges: verdict parsing (malformed outputs included), the endpoint client against a
local fake OpenAI-compatible server, the local judge through the Sampler, the RL parts of a
group's verdicts and agreement with a verifier."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from temper.rewards.judge import (
    EndpointJudge,
    Judge,
    JudgeSpec,
    JudgeUnreachable,
    LocalJudge,
    agreement,
    endpoint_judge,
    judge_parts,
    parse_verdict,
    spec_errors,
)


@pytest.mark.parametrize(
    "text, value",
    [
        ("The answer is right.\nScore: 7/10", 0.7),
        ("Rating: 4 out of 5", 0.8),
        ("**Score:** 9", 0.9),
        ("**Score**: 3", 0.3),
        ("score is 85%", 0.85),
        ("My verdict: [[8]]", 0.8),
        ("[[2/5]]", 0.4),
        ('{"score": 6}', 0.6),
        ('reasoning... {"reasoning": "ok", "score": 1.0, "max": 10}', 0.1),
        ('{"verdict": "PASS"}', 1.0),
        ('{"score": true}', 1.0),
        ("Verdict: PASS", 1.0),
        ("verdict: fail", 0.0),
        ("Decision: incorrect", 0.0),
        ("The answer is correct", 1.0),
        ("FAILED", 0.0),
        ("overall 9/10", 0.9),
        ("Score: 2/10 at first, but on reflection Score: 8/10", 0.8),  # the last verdict wins
        ("[[3]] then Score: 9/10", 0.3),  # the bracket form outranks a labelled score
        ("Score: 10", 1.0),
        ("Score: 0", 0.0),
    ],
)
def test_parse_verdict_forms(text, value):
    assert parse_verdict(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "<answer>42</answer>",  # the tiny policy answering the question instead of grading
        "1/4 of 8 is 2",  # a question's fraction, not a verdict on a usual scale
        "Score: 11/10",  # out of range: not clipped
        "Score: -1",
        "Score: 12",  # above the 0-10 scale
        "[[15]]",
        "Score: 3/0",
        "PASS or FAIL, hard to say",  # both bare words
        "The answer is not correct",  # no verdict word after the label
        '{"score": "great"}',
        '{"score": [1, 2]',  # malformed JSON, no other form
        "Verdict: maybe",
        None,
    ],
)
def test_parse_verdict_unparseable(text):
    assert parse_verdict(text) is None


def test_parse_verdict_scale():
    """A bare score is mapped through the configured range; a fraction keeps its own maximum."""
    assert parse_verdict("[[1]]", (1, 10)) == 0.0
    assert parse_verdict("Score: 5.5", (1, 10)) == pytest.approx(0.5)
    assert parse_verdict("Score: 3/4", (1, 10)) == pytest.approx(0.75)
    assert parse_verdict("Score: 0", (1, 10)) is None


def test_spec_errors():
    assert spec_errors(JudgeSpec()) == []
    bad = JudgeSpec(scale=(5, 5), fallback=2.0, api_key_env="K", timeout=0)
    assert [loc for loc, _ in spec_errors(bad)] == [("scale",), ("fallback",), ("api_key_env",), ("timeout",)]
    assert spec_errors(JudgeSpec(url="localhost:8000"))[0][0] == ("url",)


def test_judge_parts_excludes_or_falls_back():
    values = [1.0, None, 0.0, 0.5]
    parts = judge_parts(values, fallback=None)
    assert [p["judge"] for p in parts] == [1.0, 0.5, 0.0, 0.5]  # the parsed ones' mean, not 0
    assert [p["judge_parsed"] for p in parts] == [1.0, 0.0, 1.0, 1.0]
    assert [p["judge"] for p in judge_parts(values, fallback=0.25)] == [1.0, 0.25, 0.0, 0.5]
    none = judge_parts([None, None], fallback=None)
    assert [p["judge"] for p in none] == [0.0, 0.0] and sum(p["judge_parsed"] for p in none) == 0


def test_agreement_and_kappa():
    # judge says pass on 1,2,3; verifier correct on 1,2,4; item 5 unparseable
    a = agreement([0.9, 0.6, 0.7, 0.1, None, 0.0], [True, True, False, True, True, False])
    assert (a["n"], a["parsed"], a["unparseable"]) == (6, 5, 1)
    assert a["agreement"] == pytest.approx(3 / 5)
    p_j, p_v = 3 / 5, 3 / 5
    p_e = p_j * p_v + (1 - p_j) * (1 - p_v)
    assert a["kappa"] == pytest.approx((3 / 5 - p_e) / (1 - p_e))
    assert a["lo"] < 0.6 < a["hi"]
    # a judge that passes everything agrees by chance only: kappa 0
    assert agreement([1.0] * 10, [True] * 9 + [False])["kappa"] == pytest.approx(0.0)
    assert agreement([None], [True])["agreement"] is None


class _Fake(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint: replies 'Score: N/10' with N = the answer's length,
    after failing the first `fail_first` requests with 503."""

    calls: list[dict] = []
    fail_first = 0
    status = 200

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if len(type(self).calls) <= type(self).fail_first or type(self).status != 200:
            self.send_response(type(self).status if type(self).status != 200 else 503)
            self.end_headers()
            self.wfile.write(b'{"error": "busy"}')
            return
        answer = body["messages"][-1]["content"].split("[Answer]\n")[1].split("\n\n")[0]
        reply = {"choices": [{"message": {"role": "assistant", "content": f"Score: {len(answer)}/10"}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Fake.calls, _Fake.fail_first, _Fake.status = [], 0, 200
    httpd = HTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_endpoint_judge_grades_in_order(server):
    spec = JudgeSpec(url=server, model="judge-m", api_key_env="JUDGE_KEY", concurrency=3)
    judge = endpoint_judge(spec, environ={"JUDGE_KEY": "sekret"})
    verdicts = judge.grade(["q1", "q2", "q3", "q4"], ["a", "abcd", "", "abcdefghijk"])
    assert [v.value for v in verdicts] == [
        pytest.approx(0.1),
        pytest.approx(0.4),
        0.0,
        None,
    ]  # 11/10: out of range
    assert verdicts[3].text == "Score: 11/10"
    assert {c["path"] for c in _Fake.calls} == {"/v1/chat/completions"}
    assert {c["auth"] for c in _Fake.calls} == {"Bearer sekret"}
    assert {c["body"]["model"] for c in _Fake.calls} == {"judge-m"}
    assert all(c["body"]["temperature"] == 0.0 for c in _Fake.calls)


def test_endpoint_retries_with_backoff(server):
    _Fake.fail_first = 2
    waits = []
    backend = EndpointJudge(server, "m", retries=3, backoff=0.5, sleep=waits.append)
    assert backend([[{"role": "user", "content": "x\n\n[Answer]\nabc\n\n"}]]) == ["Score: 3/10"]
    assert waits == [0.5, 1.0] and len(_Fake.calls) == 3


def test_endpoint_gives_up_with_a_clear_error(server):
    _Fake.fail_first = 99
    waits = []
    backend = EndpointJudge(server, "m", retries=2, backoff=0.1, sleep=waits.append)
    with pytest.raises(JudgeUnreachable, match=r"unreachable after 3 attempts.*HTTP 503"):
        backend([[{"role": "user", "content": "x"}]])
    assert waits == [0.1, 0.2]


def test_endpoint_does_not_retry_a_refusal(server):
    _Fake.status = 401
    backend = EndpointJudge(server, "m", retries=3, sleep=lambda s: None)
    with pytest.raises(JudgeUnreachable, match="refused the request: HTTP 401"):
        backend([[{"role": "user", "content": "x"}]])
    assert len(_Fake.calls) == 1


def test_endpoint_unreachable_names_the_url():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = EndpointJudge(f"http://127.0.0.1:{port}/v1", "m", retries=1, timeout=2, sleep=lambda s: None)
    with pytest.raises(JudgeUnreachable, match=rf"127.0.0.1:{port}/v1/chat/completions unreachable after 2"):
        backend([[{"role": "user", "content": "x"}]])


def test_an_endpoint_that_never_finishes_is_given_up_at_its_deadline():
    """A server that keeps every read under the timeout but never finishes (here: a request that
    hangs) is cut at the whole request's deadline: (retries + 2) x timeout plus the backoffs."""
    from temper import guard
    from temper.guard import UserCodeError

    release = threading.Event()
    backend = EndpointJudge("http://127.0.0.1:1/v1", "m", retries=1, timeout=0.1, backoff=0.05)
    backend.one = lambda messages: release.wait()
    try:
        with pytest.raises(UserCodeError) as err:
            backend([[{"role": "user", "content": "x"}]])
        assert str(err.value) == (
            "judge endpoint http://127.0.0.1:1/v1/chat/completions did not return within 0.35 s on a request"
        )
    finally:
        release.set()
        for t in guard.user_threads():
            t.join(10)
    assert issubclass(JudgeUnreachable, UserCodeError)  # the CLI prints it as one line


def test_missing_api_key_is_an_error():
    with pytest.raises(JudgeUnreachable, match="NOPE_KEY, which is not set"):
        endpoint_judge(JudgeSpec(url="http://127.0.0.1:1/v1", api_key_env="NOPE_KEY"), environ={})


class _Sampler:
    """Records the prompts of each call; answers each prompt with a fixed verdict."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []

    def sample(self, prompts, n, **kw):
        from temper.rollout.sampler import Sample

        self.calls.append((prompts, n, kw))
        return [[Sample(p, [1], [0.0], self.replies[i], "eos")] for i, p in enumerate(prompts)]


def test_local_judge_batches_one_sampler_call(tokenizer):
    sampler = _Sampler(["Score: 9/10", "garbage", "Verdict: FAIL"])
    judge = Judge(LocalJudge(sampler, tokenizer, max_new_tokens=16), JudgeSpec())
    verdicts = judge.grade(["1+1", "2+2", "3+3"], ["2", "5", "7"])
    assert [v.value for v in verdicts] == [pytest.approx(0.9), None, 0.0]
    ((prompts, n, kw),) = sampler.calls
    assert n == 1 and len(prompts) == 3 and kw["temperature"] == 0.0 and kw["max_new_tokens"] == 16
    assert "[Answer]\n5" in tokenizer.decode(prompts[1])


def test_local_judge_runs_a_tiny_model(tokenizer, nano):
    """A real causal LM through HFSampler: whatever the untrained judge writes, each verdict is
    a value in [0, 1] or None, never an exception."""
    from temper.rollout import HFSampler

    nano.eval()
    judge = Judge(LocalJudge(HFSampler(nano, tokenizer), tokenizer, max_new_tokens=8), JudgeSpec())
    verdicts = judge.grade(["1+1"] * 3, ["2", "3", ""])
    assert len(verdicts) == 3
    assert all(v.value is None or 0.0 <= v.value <= 1.0 for v in verdicts)


# ---------------------------------------------------------------------------------------------
# the judge as an RL reward component

RECIPE = """\
name: j
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 2}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 4, batch_size: 4, warmup_steps: 1}
  - kind: rl
    tasks: [arithmetic]
    train:
      steps: 2
      rewards: {outcome: 1.0, judge: 0.5}
      judge: {model: policy, fallback: 0.5}
"""


def _recipe(old: str = "", new: str = ""):
    from temper.recipe import parse_recipe

    return parse_recipe(RECIPE.replace(old, new), source="r.yaml")


def test_recipe_accepts_a_judge_component():
    stage = _recipe().stages[1]
    assert stage.train.rewards == {"outcome": 1.0, "judge": 0.5}
    assert stage.train.judge == JudgeSpec(model="policy", fallback=0.5)
    url = "{url: http://127.0.0.1:8000/v1, model: m, api_key_env: KEY, scale: [1, 10]}"
    spec = _recipe("{model: policy, fallback: 0.5}", url).stages[1].train.judge
    assert (spec.url, spec.model, spec.api_key_env, spec.scale) == (
        "http://127.0.0.1:8000/v1",
        "m",
        "KEY",
        (1, 10),
    )


@pytest.mark.parametrize(
    "old, new, where",
    [
        # a judge component without a judge: refused at the component's line
        (
            "      judge: {model: policy, fallback: 0.5}\n",
            "",
            "r.yaml:13: stages[1].train.rewards.judge: the judge component needs a judge",
        ),
        # a judge nobody weighs
        (
            "judge: 0.5}",
            "format: 0.5}",
            "r.yaml:14: stages[1].train.judge: is set but `rewards` does not weigh it",
        ),
        (
            "fallback: 0.5",
            "fallback: 2",
            "r.yaml:14: stages[1].train.judge.fallback: is a judge value in [0, 1]",
        ),
        ("fallback: 0.5", "urll: http://x", "r.yaml:14: stages[1].train.judge.urll"),
        (
            "judge: 0.5}",
            "judges: 0.5}",
            "unknown reward component 'judges'; valid: outcome, format, overlong, process, summary, reward_model, judge",
        ),
    ],
)
def test_recipe_refuses_a_judge_misconfigured(old, new, where):
    from temper.recipe import RecipeError

    assert old in RECIPE
    with pytest.raises(RecipeError) as err:
        _recipe(old, new)
    assert where in str(err.value), str(err.value)


def _stub_judge(texts: list[str]):
    """A judge that passes answers starting below 'P' (FirstByteTask's notion of correct) and
    writes an unreadable verdict for answers starting with a digit."""

    def complete(chats):
        out = []
        for chat in chats:
            answer = chat[0]["content"].split("[Answer]\n")[1].split("\n\n[Your grade]")[0]
            texts.append(answer)
            out.append("hmm" if answer[:1].isdigit() else "Score: 10/10" if answer[:1] < "P" else "[[0]]")
        return out

    return Judge(complete, JudgeSpec())


def test_judge_reward_trains_the_policy_and_counts_unparseable(tokenizer, tmp_path):
    """With the judge as the only reward, the policy learns what the judge passes; unreadable
    verdicts are counted per step and given the group's mean, never 0."""
    import torch

    from fakes import FirstByteTask
    from temper.models import build_preset
    from temper.rewards.judge import judge_scorer
    from temper.train.rl import RLConfig, train_rl

    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    seen: list[str] = []
    config = RLConfig(
        steps=12, prompts_per_step=4, group_size=8, max_new_tokens=2, lr=1e-2, seed=0, progress=False,
        rewards={"judge": 1.0},
    )  # fmt: skip
    result = train_rl(
        model,
        tokenizer,
        [FirstByteTask()],
        config,
        tmp_path,
        scorers={"judge": judge_scorer(_stub_judge(seen))},
    )
    assert len(seen) == 12 * 4 * 8  # every sample judged, one call per step
    rewards = [row["reward/judge"] for row in result.history]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.25, rewards
    unparseable = [row["judge/unparseable"] for row in result.history]
    assert sum(unparseable) == sum(s[:1].isdigit() for s in seen) > 0
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    for row in rows:  # the logged parts: what the stub judge said (on the graded text)
        answer = row.get("graded", row["completion"])
        assert row["parts"]["judge_parsed"] == float(not answer[:1].isdigit())
        if row["parts"]["judge_parsed"]:
            assert row["parts"]["judge"] == float(answer[:1] < "P")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["step"], row["problem"]), []).append(row["parts"])
    mixed = [g for g in groups.values() if 0 < sum(p["judge_parsed"] for p in g) < len(g)]
    for g in mixed:  # an unreadable verdict gets the mean of its group's readable ones
        parsed = [p["judge"] for p in g if p["judge_parsed"]]
        assert all(p["judge"] == pytest.approx(sum(parsed) / len(parsed)) for p in g if not p["judge_parsed"])
    assert mixed


def test_choice_judge_is_the_pass_fail_likelihood(tokenizer, nano):
    """Batched, right-padded, over chats of different lengths: each value equals sigmoid(l_PASS -
    l_FAIL) from an unpadded forward of that chat alone; never unparseable."""
    import torch

    from temper.data.chat import prompt_ids
    from temper.rewards.judge import ChoiceJudge

    nano.eval()
    choose = ChoiceJudge(nano, tokenizer, batch_size=3)
    chats = [[{"role": "user", "content": "x" * k}] for k in (1, 9, 30)]
    values = choose(chats)

    def logprob(ids, word):
        w = tokenizer.encode(word, add_special_tokens=False)
        with torch.no_grad():
            logp = torch.log_softmax(nano(input_ids=torch.tensor([ids + w])).logits[0].float(), -1)
        return sum(logp[len(ids) + k - 1, t].item() for k, t in enumerate(w))

    for chat, value in zip(chats, values, strict=True):
        ids = prompt_ids(tokenizer, chat) + tokenizer.encode("Verdict: ", add_special_tokens=False)
        expected = 1 / (1 + torch.exp(torch.tensor(logprob(ids, "FAIL") - logprob(ids, "PASS"))).item())
        assert value == pytest.approx(expected, abs=1e-5)
    judge = Judge(lambda chats: ["unreadable"] * len(chats), JudgeSpec(verdict="choice"), choose)
    assert all(v.value is not None for v in judge.grade(["q"] * 3, ["a", "b", "c"]))
    assert spec_errors(JudgeSpec(url="http://h/v1", verdict="choice"))[0][0] == ("verdict",)


@pytest.mark.parametrize("verdict", ["choice", "text"])
def test_rl_stage_with_the_policy_as_judge(tmp_path, capsys, verdict):
    """The rl stage builds the judge from its block (the policy judging itself), uses it in the
    reachability probe and every step, and logs reward/judge and judge/unparseable."""
    from temper.cli import main

    recipe = tmp_path / "j.yaml"
    recipe.write_text(
        RECIPE.replace(
            "      steps: 2\n",
            "      steps: 2\n      prompts_per_step: 2\n      group_size: 2\n      max_new_tokens: 4\n",
        )
        .replace(
            "{model: policy, fallback: 0.5}", f"{{model: policy, verdict: {verdict}, max_new_tokens: 4}}"
        )
        .replace(
            "    tasks: [arithmetic]\n    train:", "    tasks: [arithmetic]\n    probe_groups: 2\n    train:"
        )
    )
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "02-rl" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "reward/judge" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0.0 <= r["reward/judge"] <= 1.0 and 0 <= r["judge/unparseable"] <= 4
        if verdict == "choice":
            assert r["judge/unparseable"] == 0


def test_train_rl_refuses_a_judge_weight_without_a_scorer(tokenizer, tmp_path):
    from fakes import FirstByteTask
    from temper.models import build_preset
    from temper.train.rl import RLConfig, train_rl

    config = RLConfig(steps=1, prompts_per_step=2, group_size=2, progress=False, rewards={"judge": 1.0})
    with pytest.raises(ValueError, match="'judge' needs a scorer"):
        train_rl(build_preset("nano", tokenizer, seed=1), tokenizer, [FirstByteTask()], config, tmp_path)
