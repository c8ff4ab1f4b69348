import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from temper.data.chat import prompt_ids
from temper.evaluate import (
    Z95,
    evaluate,
    evaluate_splits,
    format_table,
    write_eval,
)
from temper.models import build_preset, build_tokenizer
from temper.rollout import HFSampler
from temper.stats import pass_at_k, wilson_interval
from temper.tasks.base import Problem, Score, Task

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
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_preset("nano", tokenizer, seed=0)


def check_metrics(result):
    json.dumps(result, allow_nan=False)
    for name, m in result["metrics"].items():
        assert set(m) == {"value", "lo", "hi"}
        assert m["lo"] <= m["value"] <= m["hi"], name


def test_prompt_ids(tokenizer):
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "hi"}])
    assert ids == [260, ord("h"), ord("i"), tokenizer.eos_token_id, 261]


def test_always_correct(model, tokenizer):
    assert isinstance(FakeTask("always"), Task)
    r = evaluate(model, tokenizer, FakeTask("always"), "test", **KW)
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


def test_problem_dependent(model, tokenizer):
    r = evaluate(model, tokenizer, FakeTask("problem"), "test", **KW)
    check_metrics(r)
    m = r["metrics"]
    for name in ("greedy_accuracy", f"pass@{K}", f"mean@{K}", "pass@1", "greedy_reward"):
        assert m[name]["value"] == 0.5, name
    lo, hi = wilson_interval(N // 2, N, Z95)
    for name in ("greedy_accuracy", f"pass@{K}", f"mean@{K}"):
        assert (m[name]["lo"], m[name]["hi"]) == pytest.approx((lo, hi)), name
    assert r["reasons"] == {"right": 3, "wrong": 3}
    assert r["examples"][1]["score"]["correct"] is False


def test_completion_dependent_matches_sampler(model, tokenizer):
    """Metrics recomputed from the same sampler calls (same seed) and pass_at_k by hand."""
    task = FakeTask("text")
    r = evaluate(model, tokenizer, task, "ood", **KW)
    check_metrics(r)
    problems = task.sample("ood", N, KW["seed"])
    prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
    sampler = HFSampler(model, tokenizer, max_batch_rows=64)
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


def test_splits_table_and_write(model, tokenizer, tmp_path):
    kw = {**KW, "n_problems": 2, "k": 2, "max_new_tokens": 3}
    results = {"nano": evaluate_splits(model, tokenizer, FakeTask("problem"), **kw)}
    assert list(results["nano"]) == ["test", "ood"]
    table = format_table(results)
    lines = table.splitlines()
    assert len(lines) == 4
    assert "pass@2" in lines[0] and "mean@2" in lines[0]
    assert lines[2].split()[:4] == ["nano", "test", "2", "50.0"]
    path = tmp_path / "eval" / "results.json"
    write_eval(path, results)
    assert json.loads(path.read_text()) == results
