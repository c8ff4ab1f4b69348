import html
import importlib.util
import json
import math
import os
import re
import zlib
from fractions import Fraction

import pytest

from temper.evaluate import RATES, Z95, evaluate, format_table, stop_warnings, table_rows
from temper.rollout.sampler import Sample
from temper.tasks.base import Problem, Score

os.environ.setdefault("HF_HUB_OFFLINE", "1")


from temper.data.chat import prompt_ids
from temper.evaluate import (
    evaluate_splits,
    write_eval,
)
from temper.models import build_preset
from temper.rollout import HFSampler
from temper.stats import pass_at_k, wilson_interval
from temper.tasks.base import Task

N, K, MAX_NEW = 6, 3, 6
KW = dict(n_problems=N, k=K, max_new_tokens=MAX_NEW, temperature=1.0, seed=5, n_examples=2)


class FakeTask:
    """Problem i is right when i is even (`rule="problem"`), when the completion's text has an
    even number of characters (`rule="text"`), or always (`rule="always"`)."""

    name = "fake"

    def __init__(self, rule: str) -> None:
        self.rule = rule

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        return [
            Problem("fake", split, f"{split}-{seed}-{i}", f"{split} question {i}", {"i": i}) for i in range(n)
        ]

    def score(self, problem: Problem, completion: str) -> Score:
        if self.rule == "always":
            ok = True
        elif self.rule == "problem":
            ok = problem.data["i"] % 2 == 0
        else:
            ok = len(completion) % 2 == 0
        return Score(float(ok), ok, True, {"reason": "right" if ok else "wrong"})

    def demonstration(self, problem: Problem) -> str:
        return "Answer: 0"

    def corpus_text(self, problem: Problem) -> str:
        return problem.prompt


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_preset("nano", tokenizer, seed=0)


@pytest.fixture(scope="module")
def sampler(model, tokenizer):
    return HFSampler(model, tokenizer, max_batch_rows=64)


def check_metrics(result):
    json.dumps(result, allow_nan=False)
    for name, m in result["metrics"].items():
        assert set(m) == {"value", "lo", "hi"}
        assert m["lo"] <= m["value"] <= m["hi"], name


def test_prompt_ids(tokenizer):
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "hi"}])
    assert ids == [260, ord("h"), ord("i"), tokenizer.eos_token_id, 261]


def test_always_correct(sampler, tokenizer):
    assert isinstance(FakeTask("always"), Task)
    r = evaluate(sampler, tokenizer, FakeTask("always"), "test", **KW)
    check_metrics(r)
    m = r["metrics"]
    for name in ("greedy_accuracy", "parse_rate", f"pass@{K}", f"mean@{K}", "pass@1"):
        # a proportion of 0/1 values: Wilson, not a normal interval collapsed to a point
        assert m[name]["value"] == 1.0 and m[name]["hi"] == 1.0, name
        assert m[name]["lo"] == pytest.approx(wilson_interval(N, N, Z95)[0]), name
        assert m[name]["lo"] < 1.0, name
    assert (r["n_problems"], r["k"], r["reasons"]) == (N, K, {"right": N})
    assert [e["id"] for e in r["examples"]] == ["test-5-0", "test-5-1"]
    assert r["examples"][0]["score"] == {
        "reward": 1.0,
        "correct": True,
        "parsed": True,
        "reason": "right",
        "answer": None,
    }


def test_problem_dependent(sampler, tokenizer):
    r = evaluate(sampler, tokenizer, FakeTask("problem"), "test", **KW)
    check_metrics(r)
    m = r["metrics"]
    for name in ("greedy_accuracy", f"pass@{K}", f"mean@{K}", "pass@1", "greedy_reward"):
        assert m[name]["value"] == 0.5, name
    lo, hi = wilson_interval(N // 2, N, Z95)
    for name in ("greedy_accuracy", f"pass@{K}", f"mean@{K}"):
        assert (m[name]["lo"], m[name]["hi"]) == pytest.approx((lo, hi)), name
    assert r["reasons"] == {"right": 3, "wrong": 3}
    assert r["examples"][1]["score"]["correct"] is False


def test_completion_dependent_matches_sampler(sampler, tokenizer):
    """Metrics recomputed from the same sampler calls (same seed) and pass_at_k by hand."""
    task = FakeTask("text")
    r = evaluate(sampler, tokenizer, task, "ood", **KW)
    check_metrics(r)
    problems = task.sample("ood", N, KW["seed"])
    prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
    gen = dict(max_new_tokens=MAX_NEW, seed=KW["seed"])
    greedy = [cs[0] for cs in sampler.sample(prompts, 1, temperature=0.0, **gen)]
    sampled = sampler.sample(prompts, K, temperature=1.0, **gen)
    c = [sum(len(s.text) % 2 == 0 for s in cs) for cs in sampled]
    m = r["metrics"]
    assert m["greedy_accuracy"]["value"] == pytest.approx(sum(len(g.text) % 2 == 0 for g in greedy) / N)
    assert m[f"pass@{K}"]["value"] == pytest.approx(sum(ci > 0 for ci in c) / N)
    assert m[f"mean@{K}"]["value"] == pytest.approx(sum(c) / (K * N))
    assert m["pass@1"]["value"] == pytest.approx(sum(pass_at_k(K, ci, 1) for ci in c) / N)
    assert m["mean_length"]["value"] == pytest.approx(sum(len(g.token_ids) for g in greedy) / N)
    assert m["truncation_rate"]["value"] == pytest.approx(sum(g.stop_reason == "length" for g in greedy) / N)
    assert r["examples"][0]["completion"] == greedy[0].text


def test_splits_table_and_write(sampler, tokenizer, tmp_path):
    kw = {**KW, "n_problems": 2, "k": 2, "max_new_tokens": 3}
    results = {"nano": evaluate_splits(sampler, tokenizer, FakeTask("problem"), **kw)}
    assert list(results["nano"]) == ["test", "ood"]
    table = format_table(results)
    lines = table.splitlines()
    assert len(lines) == 4
    assert "pass@2" in lines[0] and "mean@2" in lines[0]
    assert lines[2].split()[:4] == ["nano", "test", "2", "50.0%"]
    path = tmp_path / "eval" / "results.json"
    write_eval(path, results)
    assert json.loads(path.read_text()) == results


class ScriptedSampler:
    """A `Sampler` with no model: problem i's greedy completion is `greedy[i]` and its samples are
    `sampled[i]` (prompts are told apart by their token ids). Records every call."""

    def __init__(self, tokenizer, problems: list[Problem], greedy: list[str], sampled: list[list[str]]):
        self.by_prompt = {
            tuple(prompt_ids(tokenizer, p.messages())): (g, s)
            for p, g, s in zip(problems, greedy, sampled, strict=True)
        }
        self.calls: list[dict] = []

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop=(), seed=0):
        self.calls.append({"n": n, "temperature": temperature, "max_new_tokens": max_new_tokens})
        out = []
        for prompt in prompts:
            greedy, sampled = self.by_prompt[tuple(prompt)]
            texts = [greedy] * n if temperature == 0.0 else sampled[:n]
            assert len(texts) == n
            out.append([self._sample(prompt, t, max_new_tokens) for t in texts])
        return out

    @staticmethod
    def _sample(prompt, text, max_new_tokens):
        ids = [ord(c) for c in text[:max_new_tokens]]  # one token per character
        stop = "length" if len(text) >= max_new_tokens else "eos"
        return Sample(list(prompt), ids, [-1.0] * len(ids), text, stop)

    def sync(self, model):
        pass


class ScriptedTask(FakeTask):
    """Right when the completion says "ok", parsed unless it says "??", and the verifier raises
    on a completion that says "boom" (a grader bug, not a wrong answer)."""

    name = "scripted"

    def __init__(self) -> None:
        super().__init__("text")

    def score(self, problem: Problem, completion: str) -> Score:
        if "boom" in completion:
            raise ZeroDivisionError("the grader divided by zero")
        ok = "ok" in completion
        return Score(float(ok), ok, "??" not in completion, {"reason": "right" if ok else "wrong"})


# problem i: its greedy completion and its K = 3 samples
GREEDY = ["ok", "no", "boom", "??", "ok-long-answer", "no"]
SAMPLED = [
    ["ok", "ok", "no"],
    ["no", "no", "no"],
    ["boom", "ok", "no"],
    ["ok", "boom", "boom"],
    ["ok", "ok", "ok"],
    ["??", "no", "ok"],
]


def _scripted(tokenizer, split="test", seed=5):
    task = ScriptedTask()
    problems = task.sample(split, len(GREEDY), seed)
    return task, ScriptedSampler(tokenizer, problems, GREEDY, SAMPLED)


def test_evaluate_takes_any_sampler_no_model_needed(tokenizer):
    """The interface is the Sampler: a scripted one (no model anywhere) gives exact numbers."""
    task, sampler = _scripted(tokenizer)
    r = evaluate(sampler, tokenizer, task, "test", **{**KW, "max_new_tokens": 8})
    check_metrics(r)
    assert sampler.calls == [
        {"n": 1, "temperature": 0.0, "max_new_tokens": 8},
        {"n": K, "temperature": 1.0, "max_new_tokens": 8},
    ]
    m = r["metrics"]
    assert m["greedy_accuracy"]["value"] == pytest.approx(2 / 6)  # "ok", "ok-long-answer"
    assert m["parse_rate"]["value"] == pytest.approx(4 / 6)  # not "??", not the verifier error
    assert m["truncation_rate"]["value"] == pytest.approx(1 / 6)  # "ok-long-answer" hits 8 tokens
    assert m["mean_length"]["value"] == pytest.approx((2 + 2 + 4 + 2 + 8 + 2) / 6)
    c = [2, 0, 1, 1, 3, 1]  # correct samples per problem
    assert m[f"mean@{K}"]["value"] == pytest.approx(sum(c) / (K * 6))
    assert m[f"pass@{K}"]["value"] == pytest.approx(5 / 6)
    assert m["pass@1"]["value"] == pytest.approx(sum(pass_at_k(K, ci, 1) for ci in c) / 6)
    assert m[f"pass@{K}"]["lo"] == pytest.approx(wilson_interval(5, 6, Z95)[0])

    greedy_only = evaluate(sampler, tokenizer, task, "test", **{**KW, "max_new_tokens": 8, "k": 0})
    assert len(sampler.calls) == 3  # one greedy call, nothing sampled
    assert {k: v for k, v in greedy_only["metrics"].items()} == {k: v for k, v in m.items() if "@" not in k}
    header, _ = table_rows({"scripted": {"test": greedy_only}})
    assert not any("@" in h for h in header)  # no pass@k / mean@k columns when nothing was sampled


def test_a_raising_verifier_gives_verifier_error_rows(tokenizer):
    """A verifier exception is a graded, counted, shown verifier_error row: no crash, and not a
    plain wrong answer. RL's grade_group grades through the same helper."""
    from temper.train.rollouts import grade_group

    task, sampler = _scripted(tokenizer)
    r = evaluate(sampler, tokenizer, task, "test", **{**KW, "max_new_tokens": 8, "n_examples": 2})
    assert r["reasons"] == {"right": 2, "wrong": 3, "verifier_error": 1}  # greedy completions
    assert (r["verifier_errors"], r["graded"]) == (1 + 3, 6 * (1 + K))  # greedy "boom" + 3 sampled
    assert r["metrics"]["greedy_accuracy"]["value"] == pytest.approx(2 / 6)
    assert r["metrics"][f"mean@{K}"]["value"] == pytest.approx(8 / 18)  # a raising sample is not correct
    # the first two examples are fine; the verifier error is shown too, with its exception
    assert [e["id"] for e in r["examples"]] == ["test-5-0", "test-5-1", "test-5-2"]
    err = r["examples"][2]["score"]
    assert err["reason"] == "verifier_error" and "ZeroDivisionError" in err["error"]
    assert err["correct"] is False and err["parsed"] is False
    header, rows = table_rows({"m": {"test": r}})
    assert header[-1] == "verifier errors" and rows[0][-1] == "4 of 24"

    problems = task.sample("test", 6, 5)
    samples = sampler.sample([prompt_ids(tokenizer, problems[3].messages())], K, max_new_tokens=8)[0]
    group = grade_group(task, problems[3], samples, {"outcome": 1.0}, 8, 0)
    assert [ro.score.details["reason"] for ro in group.rollouts] == [
        "right",
        "verifier_error",
        "verifier_error",
    ]
    assert "ZeroDivisionError" in group.rollouts[1].score.details["error"]


def _cells_of_text_table(text: str) -> list[list[str]]:
    lines = text.splitlines()
    del lines[1]  # the dashes under the header
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def _cells_of_html_table(page: str) -> list[list[str]]:
    return [
        [html.unescape(c) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", tr)]
        for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", page)
    ]


def test_cli_table_and_report_table_show_the_same_cells(tokenizer):
    """`temper eval` prints and report.html shows the same columns and numbers for the same results."""
    from temper.report import eval_table as report_table
    from temper.stages.evaluation import eval_table as cli_table

    task, sampler = _scripted(tokenizer)
    kw = {**KW, "max_new_tokens": 8}
    by_model = {
        "02-sft": evaluate_splits(sampler, tokenizer, task, ["test"], **kw),
        "03-rl": evaluate_splits(sampler, tokenizer, task, ["test"], **{**kw, "seed": 6}),
    }
    by_model["03-rl"]["test"]["metrics"]["mean_length"] = {"value": 3.25, "lo": 2.0, "hi": 4.5}
    html_rows = _cells_of_html_table(report_table(by_model))
    text_rows = _cells_of_text_table(cli_table({"scripted": by_model}))
    assert len(html_rows) == len(text_rows) == 3
    assert html_rows[0] == text_rows[0]  # the same columns, same headers
    assert "verifier errors" in html_rows[0] and "pass@3" in html_rows[0]
    for h, t in zip(html_rows[1:], text_rows[1:], strict=True):
        assert t[0] == f"scripted / {h[0]}"  # the CLI names the task beside the model
        assert h[1:] == t[1:]
    assert html_rows[1][3] == "33.3% [9.7, 70.0]"  # greedy accuracy 2/6 with its Wilson interval
    assert html_rows[2][-2] == "3.2 [2.0, 4.5]"  # length in tokens, not percent


class HashTask(FakeTask):
    """For a model's own (random) completions: the text's crc32 mod 6 decides; 1 and 5 are right,
    2 unparsed, 4 wrong, and on 0 and 3 the verifier raises."""

    name = "hash"

    def __init__(self) -> None:
        super().__init__("text")

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:  # prompts differ by seed
        return [Problem("hash", split, f"{split}-{seed}-{i}", f"{seed} asks {i}") for i in range(n)]

    def score(self, problem: Problem, completion: str) -> Score:
        h = zlib.crc32(completion.encode()) % 6
        if h in (0, 3):
            raise ValueError("grader bug")
        ok = h in (1, 5)
        return Score(float(ok), ok, h != 2, {"reason": "right" if ok else "wrong"})


def test_rl_gate_and_periodic_evals_are_evaluates_numbers(tokenizer, tmp_path):
    """The RL stage's format gate (before training) and its periodic eval (after the last update)
    report the parse rate and accuracy `evaluate` gives for the same model on the same problems."""
    from temper.models import load_model, save_model
    from temper.stages.context import StageContext
    from temper.stages.rl import HELD_OUT_SEED, RLStage, greedy_eval, run_rl
    from temper.train.rl import RLConfig
    from temper.train.user_code import UserCodeConfig

    base = build_preset("nano", tokenizer, seed=3)
    save_model(base, tokenizer, tmp_path / "base")
    task, n, max_new = HashTask(), 16, 7
    stage = RLStage(
        kind="rl",
        tasks=["hash"],
        gate={"min_parse_rate": 1.0, "n_problems": n, "on_fail": "warn"},
        probe_groups=0,
        train=RLConfig(
            steps=2,
            prompts_per_step=2,
            group_size=4,
            max_new_tokens=max_new,
            lr=1e-3,
            seed=0,
            eval_every=1,
            eval_problems=n,
            # the grader raises on a third of the completions by design: counted, not a stop
            user_code=UserCodeConfig(first_step="count", max_failed_share=1.0),
            progress=False,
        ),
    )
    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={"hash": task}, task_options={})
    out = tmp_path / "rl"
    out.mkdir()
    model_dir = run_rl(stage, ctx, tmp_path / "base", out)

    def reference(path):
        sampler = HFSampler(load_model(path), tokenizer)
        r = evaluate(
            sampler, tokenizer, task, "test", n_problems=n, seed=HELD_OUT_SEED, k=2, max_new_tokens=max_new
        )
        return sampler, r

    sampler, before = reference(tmp_path / "base")
    gate = json.loads((out / "probe.json").read_text())["gate"]
    assert gate["parse_rates"] == {"hash/parse_rate": before["metrics"]["parse_rate"]["value"]}
    assert gate.get("verifier_errors", {}).get("hash", 0) == before["reasons"].get("verifier_error", 0)
    evals = greedy_eval(sampler, tokenizer, {"hash": task}, n, max_new)
    assert evals["hash/accuracy"] == before["metrics"]["greedy_accuracy"]["value"]
    assert evals["hash/parse_rate"] == before["metrics"]["parse_rate"]["value"]

    _, after = reference(model_dir)
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["eval/hash/accuracy"] == after["metrics"]["greedy_accuracy"]["value"]
    assert last["eval/hash/parse_rate"] == after["metrics"]["parse_rate"]["value"]
    # not trivial numbers: some right, some wrong, some unparsed, some verifier errors
    for r in (before, after):
        assert 0 < r["metrics"]["greedy_accuracy"]["value"] < r["metrics"]["parse_rate"]["value"] < 1
        assert r["reasons"].get("verifier_error", 0) > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_eval_with_the_vllm_sampler_without_vllm_is_a_clear_error(tokenizer, model, tmp_path, capsys):
    from temper.cli import main
    from temper.models import save_model

    save_model(model, tokenizer, tmp_path / "m")
    args = ["eval", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "eval"), "--tasks", "arithmetic"]
    assert main([*args, "--sampler", "vllm"]) == 2
    assert "VLLMSampler needs vLLM" in capsys.readouterr().err


# ---- exact cases, folded in from test_evaluate_exact.py ----------------------------------------
# `evaluate` against a scripted sampler and task, every number worked by hand: the defaults it
# passes on, the whole result record, the clipped intervals and the example rows. Each assertion
# failed on a mutant that the model-driven tests in test_evaluate.py let through (TESTING.md).


LENGTHS = [1, 1, 1, 1, 1, 1, 10]  # greedy completion lengths (tokens)


SAMPLED_RIGHT = [2, 2, 2, 2, 2, 2, 1]  # of k = 2 samples per problem, how many are right


class HandTask:
    """Greedy text "g<i>" is right for even i; sampled text "s<i>-<j>" is right for j < SAMPLED_RIGHT[i].
    Problem 3's verifier raises on greedy text; problem 5 reports no reason; problem 1's answer is a
    Fraction (not JSON)."""

    name = "scripted"

    def __init__(self, n: int = 7, raise_on: tuple[int, ...] = (3,)) -> None:
        self.n, self.raise_on, self.calls = n, raise_on, []

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        self.calls.append((split, n, seed))
        return [Problem("scripted", split, f"p{i}", f"question {i}", {"i": i}) for i in range(self.n)]

    def score(self, problem: Problem, completion: str) -> Score:
        i = problem.data["i"]
        if completion.startswith("g"):
            if i in self.raise_on:
                raise RuntimeError("verifier bug")
            ok = i % 2 == 0
        else:
            ok = int(completion.split("-")[1]) < SAMPLED_RIGHT[i]
        details = {} if i == 5 else {"reason": "right" if ok else "wrong"}
        if i == 1:
            details["answer"] = Fraction(7, 2)
        return Score(float(ok), ok, True, details)

    def demonstration(self, problem: Problem) -> str:
        return ""

    def corpus_text(self, problem: Problem) -> str:
        return ""


class Sampler:
    def __init__(self, drop_greedy: int = 0, drop_sampled: int = 0) -> None:
        self.calls, self.drop_greedy, self.drop_sampled = [], drop_greedy, drop_sampled

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, seed=None, **kw):
        self.calls.append(
            {
                "rows": len(prompts),
                "n": n,
                "temperature": temperature,
                "max_new_tokens": max_new_tokens,
                "seed": seed,
            }
        )
        if temperature == 0.0:
            out = [
                [Sample(p, [0] * LENGTHS[i], [0.0] * LENGTHS[i], f"g{i}", "eos")]
                for i, p in enumerate(prompts)
            ]
            return out[: len(out) - self.drop_greedy]
        out = [[Sample(p, [0], [0.0], f"s{i}-{j}", "eos") for j in range(n)] for i, p in enumerate(prompts)]
        return out[: len(out) - self.drop_sampled]


def test_defaults_are_passed_to_the_task_and_the_sampler(tokenizer):
    task, sampler = HandTask(), Sampler()
    r = evaluate(sampler, tokenizer, task, "test")
    assert task.calls == [("test", 100, 1234)]
    assert sampler.calls == [
        {"rows": 7, "n": 1, "temperature": 0.0, "max_new_tokens": 64, "seed": 1234},
        {"rows": 7, "n": 4, "temperature": 1.0, "max_new_tokens": 64, "seed": 1234},
    ]
    assert (r["task"], r["split"], r["n_problems"], r["k"]) == ("scripted", "test", 7, 4)
    assert (r["temperature"], r["max_new_tokens"], r["seed"]) == (1.0, 64, 1234)
    assert [e["id"] for e in r["examples"]] == ["p0", "p1", "p2", "p3", "p4"]  # n_examples = 5


def test_the_whole_record_by_hand(tokenizer):
    task, sampler = HandTask(), Sampler()
    r = evaluate(
        sampler,
        tokenizer,
        task,
        "ood",
        n_problems=7,
        seed=9,
        k=2,
        temperature=0.5,
        max_new_tokens=12,
        n_examples=2,
    )
    assert sampler.calls[1] == {"rows": 7, "n": 2, "temperature": 0.5, "max_new_tokens": 12, "seed": 9}
    assert set(r) == {
        "task",
        "split",
        "n_problems",
        "k",
        "temperature",
        "max_new_tokens",
        "seed",
        "metrics",
        "reasons",
        "greedy_correct",
        "graded",
        "verifier_errors",
        "failures",
        "examples",
        "special_tokens",
        "stop_warning",
    }
    line = HandTask.score.__code__.co_firstlineno + 4  # `raise RuntimeError("verifier bug")`
    assert r["failures"] == {
        "verifier_error": {
            "count": 1,
            "first": "the verifier of task 'scripted' raised on problem p3: RuntimeError: verifier bug "
            f"(at test_evaluate.py:{line})",
        }
    }
    assert (r["special_tokens"], r["stop_warning"]) == (
        {},
        None,
    )  # the fake tokenizer has no specials in the text
    # greedy: right at i = 0, 2, 4, 6; i = 3 raised; i = 5 has no reason
    assert r["reasons"] == {"right": 4, "wrong": 1, "verifier_error": 1, "unknown": 1}
    assert r["greedy_correct"] == "1010101"
    assert (r["graded"], r["verifier_errors"]) == (7 + 14, 1)

    # mean length over (1, 1, 1, 1, 1, 1, 10): m = 16/7, s^2 = (6 (9/7)^2 + (54/7)^2) / 6
    m = 16 / 7
    s = math.sqrt((6 * (1 - m) ** 2 + (10 - m) ** 2) / 6)
    length = r["metrics"]["mean_length"]
    assert length["value"] == pytest.approx(m)
    assert m - Z95 * s / math.sqrt(7) < 0  # the normal interval reaches below 0 tokens ...
    assert length["lo"] == 0.0  # ... and is clipped there
    assert length["hi"] == pytest.approx(m + Z95 * s / math.sqrt(7), rel=1e-12)  # with z = Z95 exactly

    # mean@2 over (1, 1, 1, 1, 1, 1, 0.5): not all 0/1, so a normal interval clipped to [0, 1]
    m2 = 6.5 / 7
    s2 = math.sqrt((6 * (1 - m2) ** 2 + (0.5 - m2) ** 2) / 6)
    mean2 = r["metrics"]["mean@2"]
    assert mean2["value"] == pytest.approx(m2)
    assert m2 + Z95 * s2 / math.sqrt(7) > 1.0 and mean2["hi"] == 1.0
    assert mean2["lo"] == pytest.approx(m2 - Z95 * s2 / math.sqrt(7), rel=1e-12)

    # "completion" is what the sampled ids show (decoded with special tokens marked: the scripted
    # sampler's one id is its eos, so nothing), "graded" the text the task graded when they differ
    assert r["examples"] == [
        {
            "id": "p0",
            "prompt": "question 0",
            "completion": "",
            "graded": "g0",
            "stop_reason": "eos",
            "score": {"reward": 1.0, "correct": True, "parsed": True, "reason": "right", "answer": None},
        },
        {
            "id": "p1",
            "prompt": "question 1",
            "completion": "",
            "graded": "g1",
            "stop_reason": "eos",
            "score": {"reward": 0.0, "correct": False, "parsed": True, "reason": "wrong", "answer": "7/2"},
        },
        # not among the first two, shown so that a broken verifier is seen
        {
            "id": "p3",
            "prompt": "question 3",
            "completion": "",
            "graded": "g3",
            "stop_reason": "eos",
            "score": {
                "reward": 0.0,
                "correct": False,
                "parsed": False,
                "reason": "verifier_error",
                "answer": None,
                "error": "the verifier of task 'scripted' raised on problem p3: RuntimeError: verifier bug "
                f"(at test_evaluate.py:{HandTask.score.__code__.co_firstlineno + 4})",
            },
        },
    ]


def test_examples_show_one_verifier_error_and_none_when_no_examples_are_asked(tokenizer):
    kw = dict(n_problems=7, k=0, max_new_tokens=12)
    r = evaluate(Sampler(), tokenizer, HandTask(raise_on=(3, 4)), "test", n_examples=1, **kw)
    assert [e["id"] for e in r["examples"]] == ["p0", "p3"]  # only the first error after the shown rows
    assert evaluate(Sampler(), tokenizer, HandTask(), "test", n_examples=0, **kw)["examples"] == []


def test_argument_and_length_checks(tokenizer):
    one = evaluate(Sampler(), tokenizer, HandTask(n=1), "test", n_problems=1, k=0)
    assert one["n_problems"] == 1
    with pytest.raises(ValueError, match=r"^evaluate needs k >= 0 and n_problems >= 1$"):
        evaluate(Sampler(), tokenizer, HandTask(), "test", k=-1)
    with pytest.raises(ValueError, match=r"^evaluate needs k >= 0 and n_problems >= 1$"):
        evaluate(Sampler(), tokenizer, HandTask(), "test", n_problems=0, k=1)
    with pytest.raises(ValueError, match=r"^task 'scripted' returned no problems for split 'ood'$"):
        evaluate(Sampler(), tokenizer, HandTask(n=0), "ood")
    # a sampler that returns fewer rows than prompts is an error, not a shorter evaluation
    with pytest.raises(ValueError, match="zip"):
        evaluate(Sampler(drop_greedy=1), tokenizer, HandTask(), "test", n_problems=7, k=0)
    with pytest.raises(ValueError, match="zip"):
        evaluate(Sampler(drop_sampled=1), tokenizer, HandTask(), "test", n_problems=7, k=2)


def test_format_table_text_exactly():
    def metric(v, lo, hi):
        return {"value": v, "lo": lo, "hi": hi}

    result = {
        "n_problems": 8,
        "k": 0,
        "metrics": {
            "greedy_accuracy": metric(0.5, 0.25, 0.75),
            "parse_rate": metric(1.0, 0.5, 1.0),
            "truncation_rate": metric(0.0, 0.0, 0.125),
            "mean_length": metric(3.0, 2.0, 4.0),
        },
    }
    text = format_table({"base": {"test": result}, "a-longer-label": {"ood": result}})
    assert text.split("\n") == [
        "model           split  n  greedy acc          parse rate            trunc rate        mean length",
        "--------------  -----  -  ------------------  --------------------  ----------------  --------------",
        "base            test   8  50.0% [25.0, 75.0]  100.0% [50.0, 100.0]  0.0% [0.0, 12.5]  3.0 [2.0, 4.0]",
        "a-longer-label  ood    8  50.0% [25.0, 75.0]  100.0% [50.0, 100.0]  0.0% [0.0, 12.5]  3.0 [2.0, 4.0]",
    ]  # left-aligned columns two spaces apart, no trailing spaces (the header's last cell is padded)


# ---- exact cases, folded in from test_evaluate_table_exact.py ----------------------------------
# Exact tests of the eval table's cells (`temper.evaluate.table_rows`) and of `stop_warnings`:
# mixed k, missing metrics, the verifier-error column's defaults. Written against the mutants
# mutmut left alive (TESTING.md).


def metric(v, lo, hi):
    return {"value": v, "lo": lo, "hi": hi}


def test_rates():
    assert RATES == {
        "greedy_accuracy": "greedy acc",
        "pass@k": "pass@k",
        "mean@k": "mean@k",
        "parse_rate": "parse rate",
        "truncation_rate": "trunc rate",
    }


def test_rows_with_different_k_missing_metrics_and_verifier_errors():
    a = {
        "n_problems": 4,
        "k": 2,
        "verifier_errors": 1,
        "graded": 12,
        "metrics": {
            "greedy_accuracy": metric(0.25, 0.0, 0.5),
            "pass@2": metric(0.5, 0.25, 0.75),
            "mean@2": metric(0.375, 0.125, 0.625),
            "parse_rate": metric(1.0, 1.0, 1.0),
            "truncation_rate": metric(0.0, 0.0, 0.0),
            "mean_length": metric(12.25, 10.0, 14.5),
        },
    }
    b = {"n_problems": 3, "k": 4, "metrics": {"pass@4": metric(1.0, 0.5, 1.0)}}
    header, rows = table_rows({"base": {"test": a}, "rl": {"ood": b}})
    assert header == [
        "model",
        "split",
        "n",
        "greedy acc",
        "pass@k",
        "mean@k",
        "parse rate",
        "trunc rate",
        "mean length",
        "verifier errors",
    ]
    assert rows == [
        [
            "base",
            "test",
            "4",
            "25.0% [0.0, 50.0]",
            "50.0% [25.0, 75.0]",
            "37.5% [12.5, 62.5]",
            "100.0% [100.0, 100.0]",
            "0.0% [0.0, 0.0]",
            "12.2 [10.0, 14.5]",
            "1 of 12",
        ],
        ["rl", "ood", "3", "–", "100.0% [50.0, 100.0]", "–", "–", "–", "–", "0 of ?"],
    ]


def test_one_k_names_the_columns_and_no_errors_no_column():
    r = {"n_problems": 1, "k": 8, "verifier_errors": 0, "metrics": {}}
    header, rows = table_rows({"m": {"test": r, "ood": dict(r, k=0)}})
    assert header[3:] == ["greedy acc", "pass@8", "mean@8", "parse rate", "trunc rate", "mean length"]
    assert rows[1] == ["m", "ood", "1", "–", "–", "–", "–", "–", "–"]
    header, _ = table_rows({"m": {"test": dict(r, k=0)}})
    assert header == ["model", "split", "n", "greedy acc", "parse rate", "trunc rate", "mean length"]


def test_stop_warnings_group_the_rows_of_each_warning():
    results = {
        "base": {"test": {"stop_warning": "W1"}, "ood": {"stop_warning": None}},
        "sft": {"test": {"stop_warning": "W1"}, "ood": {"stop_warning": "W2"}},
        "rl": {"test": {}},
    }
    assert stop_warnings(results) == ["base test, sft test: W1", "sft ood: W2"]
    assert stop_warnings({}) == []
