"""Exact tests of `temper.tasks.base`: the split check's message, the seeded draw with and without
repeats, a problem's chat messages, and `grade` / `grade_batch` turning verifier failures into
graded rows. Written for the mutation run (TESTING.md)."""

import inspect
import random
from pathlib import Path

import pytest

from temper.tasks.base import (
    SPLITS,
    Problem,
    Score,
    check_split,
    draw,
    grade,
    grade_batch,
    split_of,
    verifier_error,
)


def test_check_split():
    assert SPLITS == ("train", "test", "ood")
    for split in SPLITS:
        check_split(split)
    with pytest.raises(ValueError) as err:
        check_split("dev")
    assert str(err.value) == "unknown split 'dev'; valid splits: train, test, ood"


def test_draw_without_repeats_is_a_seeded_sample():
    rows = list(range(5))
    assert draw(rows, "k", 3, repeat=False) == random.Random("k").sample(rows, 3)
    assert sorted(draw(rows, "k", 9, repeat=False)) == rows  # at most all of them


def test_draw_with_repeats_concatenates_whole_shuffles():
    rows = list(range(3))
    rng = random.Random("k")
    expected = rng.sample(rows, 3) + rng.sample(rows, 3) + rng.sample(rows, 3)
    assert draw(rows, "k", 7, repeat=True) == expected[:7]
    assert draw(rows, "k", 3, repeat=True) == expected[:3]
    assert draw(rows, "k", 0, repeat=True) == []


def test_messages_of_a_problem():
    plain = Problem("t", "test", "1", "q")
    assert plain.messages() == [{"role": "user", "content": "q"}]
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    p = Problem("t", "test", "1", "q", {}, chat)
    assert p.messages() == chat and p.messages()[0] is not chat[0]


def _at(fn, text: str) -> str:
    """`file.py:line` of the first line of `fn` holding `text` (where a failure's line points)."""
    lines, first = inspect.getsourcelines(fn)
    return (
        f"{Path(inspect.getsourcefile(fn)).name}:{first + next(i for i, x in enumerate(lines) if text in x)}"
    )


class Task:
    name = "t"

    def score(self, problem, completion):
        if completion == "boom":
            raise KeyError("x")
        return Score(1.0, True, True, {"reason": "correct", "id": problem.id})


def test_grade_turns_a_verifier_failure_into_a_graded_row():
    p = Problem("t", "test", "1", "q")
    assert grade(Task(), p, "ok") == Score(1.0, True, True, {"reason": "correct", "id": "1"})
    # the line names the task, the problem, the exception and the line of the (user's) verifier
    said = f"the verifier of task 't' raised on problem 1: KeyError: 'x' (at {_at(Task.score, 'raise')})"
    assert grade(Task(), p, "boom") == Score(0.0, False, False, {"reason": "verifier_error", "error": said})
    assert verifier_error(ValueError("v")) == Score(
        0.0, False, False, {"reason": "verifier_error", "error": "ValueError('v')"}
    )


def test_a_non_finite_reward_is_a_verifier_error_naming_the_task():
    class Inf(Task):
        def score(self, problem, completion):
            return Score(float(completion), False, True)

    p = Problem("t", "test", "1", "q")
    assert grade(Inf(), p, "2.5").reward == 2.5
    for bad in ("inf", "-inf", "nan"):
        said = f"the verifier of task 't' returned a non-finite reward ({float(bad)!r}) on problem 1"
        assert grade(Inf(), p, bad) == Score(0.0, False, False, {"reason": "verifier_error", "error": said})


def test_grade_batch_one_by_one_or_through_score_batch():
    p = Problem("t", "test", "1", "q")
    assert [
        s.reason if hasattr(s, "reason") else s.details["reason"]
        for s in grade_batch(Task(), [p, p], ["ok", "boom"])
    ] == [
        "correct",
        "verifier_error",
    ]

    class Batch(Task):
        def __init__(self, out):
            self.out = out
            self.calls = []

        def score_batch(self, problems, completions, completion_ids):
            self.calls.append((problems, completions, completion_ids))
            if isinstance(self.out, Exception):
                raise self.out
            return self.out

    good = Score(1.0, True, True, {})
    task = Batch((good, good))
    assert grade_batch(task, (p, p), ("a", "b"), [[1], [2]]) == [good, good]
    assert task.calls == [([p, p], ["a", "b"], [[1], [2]])]
    short = grade_batch(Batch([good]), [p, p], ["a", "b"])
    said = "the verifier of task 't' (score_batch) returned 1 scores for 2 completions on problem 1"
    assert short == [Score(0.0, False, False, {"reason": "verifier_error", "error": said})] * 2
    failed = grade_batch(Batch(RuntimeError("r")), [p, p], ["a", "b"])
    said = f"the verifier of task 't' raised on problem 1: RuntimeError: r (at {_at(Batch.score_batch, 'raise')})"
    assert failed == [Score(0.0, False, False, {"reason": "verifier_error", "error": said})] * 2
    q = Problem("t", "test", "2", "q")
    infinite = grade_batch(Batch([good, Score(float("inf"), True, True)]), [p, q], ["a", "b"])
    said = "the verifier of task 't' returned a non-finite reward (inf) on problem 2"
    assert infinite == [good, Score(0.0, False, False, {"reason": "verifier_error", "error": said})]


# ---- exact cases, folded in from test_tasks_exact.py -------------------------------------------
# Exact edges of the task layer the mutation run (TESTING.md) found untested: the split hash, the
# config errors users see, and the expression grader's limits and messages.


def test_split_is_the_big_endian_first_8_bytes_of_sha256_below_the_fraction():
    # sha256(b"c") starts 2e7d2c03a9507ae2: big-endian that is 0.1816 of 2**64 (little-endian 0.885)
    point = int("2e7d2c03a9507ae2", 16) / 2**64
    assert split_of("c", 0.2) == "test" and split_of("c", 0.18) == "train"
    assert split_of("c", point) == "train"  # strictly below the fraction is "test"
    assert split_of("c", point + 1e-12) == "test"
