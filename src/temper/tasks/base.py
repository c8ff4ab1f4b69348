"""The `Task` interface: one object owns problem generation, prompt rendering, parsing and grading.

Eval and RL both call `Task.score`, so the two never drift apart (nanochat's `reward()` reuses
its `evaluate()` in the same way).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from temper import guard
from temper.guard import UserCodeFailure

SPLITS = ("train", "test", "ood")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def split_of(key: str, test_fraction: float) -> str:
    """The in-distribution split of a problem key: "test" for a stable `test_fraction` of keys,
    else "train". sha256 rather than `hash()`, which Python salts per process."""
    point = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return "test" if point < test_fraction else "train"


def draw(rows: list, key: str, n: int, repeat: bool) -> list:
    """`n` of `rows` in an order seeded by `key`: without repeats (at most all of them) for held-out
    splits; with `repeat`, whole seeded shuffles one after another, so RL always gets `n` prompts."""
    rng = random.Random(key)
    if not repeat:
        return rng.sample(rows, min(n, len(rows)))
    out: list = []
    while len(out) < n:
        out += rng.sample(rows, len(rows))
    return out[:n]


@dataclass(frozen=True)
class Problem:
    """One verifiable problem. `data` holds what the grader needs (operands, cards, target...)."""

    task: str
    split: str
    id: str
    prompt: str  # the user turn's text
    data: dict[str, Any] = field(default_factory=dict)
    chat: list[dict[str, Any]] | None = None
    """A whole chat prompt (system turn, earlier turns) when the task has one; `prompt` is then
    its last user turn, for tables and logs."""

    def messages(self) -> list[dict[str, Any]]:
        """The chat prompt the policy sees (no assistant turn)."""
        if self.chat is not None:
            return [dict(m) for m in self.chat]
        return [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class Score:
    """The grade of one completion.

    reward: the scalar outcome reward (1.0 correct, 0.0 otherwise, unless a task says more).
    correct: the answer is right.
    parsed: an answer could be extracted in the required format (format stability).
    details: why (`reason`), what was parsed (`answer`), and task-specific facts.
    """

    reward: float
    correct: bool
    parsed: bool
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    name: str

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` ("train", "test" or "ood"), deterministic in `seed`.

        test and train never share a problem; ood follows a shifted rule or surface."""
        ...

    def score(self, problem: Problem, completion: str) -> Score:
        """Grade the assistant's completion text. Never raises on model output."""
        ...

    def demonstration(self, problem: Problem) -> str:
        """A correct assistant response in the required format, for SFT."""
        ...

    def corpus_text(self, problem: Problem) -> str:
        """The problem and its solution in plain notation, without the chat protocol (pre-training)."""
        ...


class TaskOptionError(ValueError):
    """A task option that cannot be used (a data column that is not there, a reward function that
    cannot be imported); `option` is its key path inside the task entry, so a recipe error points
    at that key's line."""

    def __init__(self, option: tuple[str | int, ...], message: str):
        self.option = option
        super().__init__(message)


VERIFIER_ERROR = "verifier_error"


def grade(task: Task, problem: Problem, completion: str) -> Score:
    """`task.score`, with an exception in the verifier turned into a graded row whose reason is
    "verifier_error" (and `details["error"]` one line naming the task, the problem and the
    exception). A verifier bug is an infrastructure error, not the model's mistake: RL and
    evaluation both grade through here, so neither crashes on it and both can count it apart from
    wrong answers. A non-finite reward is one too (it would reach the loss as NaN)."""
    try:
        return _finite(task, problem, task.score(problem, completion))
    except Exception as err:  # any verifier failure; KeyboardInterrupt and the like still stop the run
        return verifier_error(guard.raised(err, _verifier(task), f"problem {problem.id}"))


def _verifier(task: Task) -> str:
    return f"the verifier of task {getattr(task, 'name', type(task).__name__)!r}"


def _finite(task: Task, problem: Problem, score: Score) -> Score:
    try:
        ok = math.isfinite(float(score.reward))
    except (TypeError, ValueError):
        ok = False
    if ok:
        return score
    return verifier_error(
        guard.returned(_verifier(task), f"a non-finite reward ({score.reward!r})", f"problem {problem.id}")
    )


def verifier_error(err: BaseException) -> Score:
    """The grade of a completion its verifier failed on: `details["error"]` is the failure's line
    (`temper.guard.UserCodeFailure`), or the exception's repr."""
    said = err.line if isinstance(err, UserCodeFailure) else repr(err)
    return Score(0.0, False, False, {"reason": VERIFIER_ERROR, "error": said})


def grade_batch(
    task: Task,
    problems: Sequence[Problem],
    completions: Sequence[str],
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> list[Score]:
    """Grade many completions at once: through the task's `score_batch` when it has one (reward
    functions that take a whole batch, as TRL calls them: one call per group, not per sample),
    else `grade` one by one. A `score_batch` that raises grades every completion as a
    verifier_error (a task that can tell which completion broke it catches that itself)."""
    batch = getattr(task, "score_batch", None)
    if batch is None:
        return [grade(task, p, c) for p, c in zip(problems, completions, strict=True)]
    context = f"problem {problems[0].id}" if problems else ""
    if len({p.id for p in problems}) > 1:
        context = f"{len(problems)} completions ({problems[0].id}, ...)"
    try:
        scores = list(batch(list(problems), list(completions), completion_ids))
    except Exception as err:
        failure = guard.raised(err, _verifier(task), context)
        return [verifier_error(failure) for _ in completions]
    if len(scores) != len(completions):
        failure = guard.returned(
            f"{_verifier(task)} (score_batch)",
            f"{len(scores)} scores for {len(completions)} completions",
            context,
        )
        return [verifier_error(failure) for _ in completions]
    return [_finite(task, p, s) for p, s in zip(problems, scores, strict=True)]
