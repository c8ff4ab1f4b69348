"""The `Task` interface: one object owns problem generation, prompt rendering, parsing and grading.

Eval and RL both call `Task.score`, so the two never drift apart (nanochat's `reward()` reuses
its `evaluate()` in the same way).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


# What a task may do besides the four methods of `Task`: one protocol per optional capability,
# checked with `isinstance` where it is used. Runtime-checkable protocols look at the members only,
# so a class that has them is one without subclassing anything (a user's task included); a method
# set to None counts as absent. The capabilities of environment tasks and envs (`make_env`, `cut`,
# tools...) are in `temper.envs.base`.


@runtime_checkable
class BatchScored(Protocol):
    """A task that grades a group of completions in one call (reward functions that take a batch,
    as TRL calls them). Implemented by `DataTask`; called by `grade_batch`, which grades one by one
    through `score` for a task without it."""

    def score_batch(
        self,
        problems: Sequence[Problem],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Score]: ...


@runtime_checkable
class Fingerprinted(Protocol):
    """A task that reads something beyond its options (a data task's rows and reward code): a
    digest of it, which the stage hash covers, so editing the data reruns the stage. Implemented by
    `DataTask` (and `EnvDataTask`) and `TwoMode` (its base task's); read by
    `catalog.task_fingerprints`."""

    def fingerprint(self) -> str: ...


@runtime_checkable
class BuiltFromRecipe(Protocol):
    """A task CLASS with a `build(config, name, base_dir)` classmethod: a task that reads files
    relative to the recipe's folder, or whose recipe key is its name. Checked on the class
    (`isinstance(cls, BuiltFromRecipe)`). Implemented by `DataTask`, `ReasoningGym` and
    `SimulatedSearchTask`; called by `catalog.make_task` instead of `cls(config)`, and the rl stage
    refuses stage `task_options` for such a task (it cannot be rebuilt from its config alone)."""

    def build(self, config: Any, name: str, base_dir: Path | None) -> Task: ...


@runtime_checkable
class WrapsTask(Protocol):
    """A task CLASS over another task that the catalog builds: a `wrap(config, name, make_inner)`
    classmethod, `make_inner()` building the base task from the entry's options. Checked on the
    class. Implemented by `TwoMode`, `Translated` and `ThinkingLanguage`; called by `catalog.make_task`."""

    def wrap(self, config: Any, name: str, make_inner: Callable[[], Task]) -> Task: ...


def inner_task(kind: str, base: str, make_inner: Callable[[], Any]) -> Any:
    """A wrapper task's base task (`WrapsTask.wrap`), its errors located at the entry's `base` or
    `options`; a wrapper of kind `kind` cannot wrap another one."""
    if base == kind:
        raise TaskOptionError(("base",), f"a {kind} task cannot wrap another {kind} task")
    try:
        return make_inner()
    except TaskOptionError:
        raise
    except ValueError as err:
        raise TaskOptionError(("options" if "option" in str(err) else "base",), str(err)) from err


@runtime_checkable
class SamplesAtStep(Protocol):
    """A task whose RL training problems depend on the step (a curriculum: a noise schedule, a pool
    grown from failures). Implemented by `SimulatedSearchTask`, `CodeRepairTask` and `WebShopTask`; the RL loop
    (`train.collect.problems_for_step`) calls it instead of `sample`, and the rl stage leaves such a
    task out of the contamination screen of the drawn prompts (its pool is not known up front)."""

    def sample_at_step(self, split: str, n: int, seed: int, step: int) -> list[Problem]: ...


@runtime_checkable
class DeclaresPathSignals(Protocol):
    """A task whose episodes emit named signals about the path (signal -> kind, one of
    `temper.rewards.path.KINDS`), which RLVP path rewards and the reward-hacking monitors read; a
    class attribute, so the rl config can read it off the class. Implemented by `MultiToolTask`
    and `CodeRepairTask`; read through `path_signals_of` by `rewards.path`, the rl config's check
    of `rewards` keys and the monitors feature."""

    path_signals: Mapping[str, str]


def path_signals_of(task: Any) -> Mapping[str, str]:
    """The path signals a task (or task class) declares; {} for one that declares none (or None)."""
    return (task.path_signals or {}) if isinstance(task, DeclaresPathSignals) else {}


class FailureCurriculum(Protocol):
    """A train pool that grows from the problems whose whole RL group failed
    (`temper.envs.curriculum.Curriculum`, with code_repair's and web_shop's variants)."""

    def resume(self, out_dir: Path, start: int, main: bool) -> None:
        """Replay the growth logged before step `start` (a resumed run)."""
        ...

    def after_step(self, step: int, drawn: list[tuple[str, bool]]) -> dict[str, float]:
        """Grow from the step's (problem id, whole group failed) pairs; the step's metrics."""
        ...


@runtime_checkable
class CurriculumTask(Protocol):
    """A task that may grow its train pool from failures: `failure_curriculum` is the curriculum,
    or None when the recipe did not ask for one (present but None means no curriculum: read it
    through `curriculum_of`). Implemented by `CodeRepairTask` and `WebShopTask` (their `curriculum:` option); the curriculum
    RL feature (`train.features.curriculum`) grows it after each step."""

    failure_curriculum: FailureCurriculum | None


def curriculum_of(task: Any) -> FailureCurriculum | None:
    """The task's failure curriculum; None for a task without one (or with it off)."""
    return task.failure_curriculum if isinstance(task, CurriculumTask) else None


@runtime_checkable
class DemonstratesEpisodes(Protocol):
    """A multi-turn task whose SFT demonstration is a whole episode (every move an assistant turn,
    the environment's answers between them) rather than one answer after the prompt. Implemented
    by the environment tasks `treasure_hunt`, `multi_tool`, `orchestrator`, `code_repair` and
    `simulated_search`;
    called by the sft stage instead of `demonstration`."""

    def demonstration_messages(self, problem: Problem) -> list[dict[str, Any]]: ...


@runtime_checkable
class DemonstratesRows(Protocol):
    """A multi-turn task whose demonstrated episode is several training rows: a context budget
    compacts its conversation partway (`temper.rollout.context`), and each row is a (prompt,
    completion) pair of message lists of the shape the agent loop then sees: the prompt (after a
    compaction: the task, the carried-over summary and the latest observation) is never trained,
    as the loop never trains a row's prompt. Implemented by `memory_corridor`; the sft stage makes
    one prompt/completion example of each row (it takes precedence over `demonstration_messages`)."""

    def demonstration_rows(
        self, problem: Problem
    ) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]: ...


@runtime_checkable
class MarksEnvironmentSpans(Protocol):
    """A task whose demonstrations hold text the environment writes inside the assistant turn (an
    inline tool's output): those spans are masked out of the SFT loss. Implemented by
    `CalculatorTask`; called by the sft stage."""

    def environment_spans(self, problem: Problem) -> list[str]: ...


@runtime_checkable
class KeysProblems(Protocol):
    """A task whose prompt does not identify a problem (an environment's first observation, which
    other problems share): `problem_key` does (the treasure hunt's map), and the contamination
    check matches its eval problems by key, not by text. Implemented by `TreasureHuntTask`; called
    by `temper.data.contamination` and the sft stage's demonstrations."""

    def problem_key(self, problem: Problem) -> str: ...


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
    if not isinstance(task, BatchScored):
        return [grade(task, p, c) for p, c in zip(problems, completions, strict=True)]
    context = f"problem {problems[0].id}" if problems else ""
    if len({p.id for p in problems}) > 1:
        context = f"{len(problems)} completions ({problems[0].id}, ...)"
    try:
        scores = list(task.score_batch(list(problems), list(completions), completion_ids))
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
