"""`evaluate` against a scripted sampler and task, every number worked by hand: the defaults it
passes on, the whole result record, the clipped intervals and the example rows. Each assertion
failed on a mutant that the model-driven tests in test_evaluate.py let through (TESTING.md)."""

import math
from fractions import Fraction

import pytest

from temper.evaluate import Z95, evaluate, format_table
from temper.rollout.sampler import Sample
from temper.tasks.base import Problem, Score

LENGTHS = [1, 1, 1, 1, 1, 1, 10]  # greedy completion lengths (tokens)
SAMPLED_RIGHT = [2, 2, 2, 2, 2, 2, 1]  # of k = 2 samples per problem, how many are right


class Task:
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


@pytest.fixture(scope="module")
def tokenizer():
    from temper.models import build_tokenizer

    return build_tokenizer()


def test_defaults_are_passed_to_the_task_and_the_sampler(tokenizer):
    task, sampler = Task(), Sampler()
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
    task, sampler = Task(), Sampler()
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
    line = Task.score.__code__.co_firstlineno + 4  # `raise RuntimeError("verifier bug")`
    assert r["failures"] == {
        "verifier_error": {
            "count": 1,
            "first": "the verifier of task 'scripted' raised on problem p3: RuntimeError: verifier bug "
            f"(at test_evaluate_exact.py:{line})",
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
                f"(at test_evaluate_exact.py:{Task.score.__code__.co_firstlineno + 4})",
            },
        },
    ]


def test_examples_show_one_verifier_error_and_none_when_no_examples_are_asked(tokenizer):
    kw = dict(n_problems=7, k=0, max_new_tokens=12)
    r = evaluate(Sampler(), tokenizer, Task(raise_on=(3, 4)), "test", n_examples=1, **kw)
    assert [e["id"] for e in r["examples"]] == ["p0", "p3"]  # only the first error after the shown rows
    assert evaluate(Sampler(), tokenizer, Task(), "test", n_examples=0, **kw)["examples"] == []


def test_argument_and_length_checks(tokenizer):
    one = evaluate(Sampler(), tokenizer, Task(n=1), "test", n_problems=1, k=0)
    assert one["n_problems"] == 1
    with pytest.raises(ValueError, match=r"^evaluate needs k >= 0 and n_problems >= 1$"):
        evaluate(Sampler(), tokenizer, Task(), "test", k=-1)
    with pytest.raises(ValueError, match=r"^evaluate needs k >= 0 and n_problems >= 1$"):
        evaluate(Sampler(), tokenizer, Task(), "test", n_problems=0, k=1)
    with pytest.raises(ValueError, match=r"^task 'scripted' returned no problems for split 'ood'$"):
        evaluate(Sampler(), tokenizer, Task(n=0), "ood")
    # a sampler that returns fewer rows than prompts is an error, not a shorter evaluation
    with pytest.raises(ValueError, match="zip"):
        evaluate(Sampler(drop_greedy=1), tokenizer, Task(), "test", n_problems=7, k=0)
    with pytest.raises(ValueError, match="zip"):
        evaluate(Sampler(drop_sampled=1), tokenizer, Task(), "test", n_problems=7, k=2)


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
