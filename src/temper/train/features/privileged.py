"""On-policy self-distillation (OPSD), the RL feature `teacher_context: solution`: the teacher is
the policy itself (`teacher: self`) or a frozen model with privileged context (the worked
solution) in its prompt; the student never sees it.

Each sampled completion is scored twice: by the student on its own prompt (the policy update) and
by the teacher on the prompt with the solution added (the reference forward of `rl_update.prepare`),
so the per-token advantage of `on_policy_distill` is log pi(y_t | x, solution) - log pi(y_t | x).
Everything hinges on the student never reading the solution, so `check_no_leak` verifies it on the
exact token ids the update reads, every step (our own check; a leak would make the teacher's
advantage vanish and the student learn to copy context it will not have at test time).
"""

from __future__ import annotations

from typing import Any, Literal

from temper.data.chat import prompt_ids
from temper.envs.base import EnvTask
from temper.tasks.base import Problem, Task
from temper.train.features.base import BatchExtras, Error, Hooks, RLFeature, RunStart, StageView, Step

SELF = "self"
"""`teacher: self`: the policy itself is the teacher (on-policy self-distillation)."""

HEADER = "A correct worked solution, for reference:\n"


def privileged_text(task: Task, problem: Problem) -> str:
    """The context only the teacher sees: the task's worked demonstration of this problem."""
    return HEADER + task.demonstration(problem)


def teacher_messages(task: Task, problem: Problem) -> list[dict[str, Any]]:
    """The student's chat prompt with the privileged text appended to its last user message."""
    messages = problem.messages()
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last] = {
        **messages[last],
        "content": f"{messages[last]['content']}\n\n{privileged_text(task, problem)}",
    }
    return messages


def teacher_prompts(tokenizer, tasks: dict[str, Task], problems: list[Problem]) -> list[list[int]]:
    """The teacher's prompt ids, one per row (`problems[r]` is row r's problem)."""
    return [prompt_ids(tokenizer, teacher_messages(tasks[p.task], p)) for p in problems]


class PrivilegedLeak(RuntimeError):
    """The student's input holds the teacher's privileged context."""


def check_no_leak(tokenizer, student_prompts: list[list[int]], secrets: list[str]) -> None:
    """Raise `PrivilegedLeak` if any row's student prompt holds its privileged text: as text after
    decoding, or as the token ids the text encodes to (a leak that survives decoding differently)."""
    for r, (ids, secret) in enumerate(zip(student_prompts, secrets, strict=True)):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        secret_ids = tokenizer.encode(secret, add_special_tokens=False)
        if secret in text or _contains(ids, secret_ids):
            raise PrivilegedLeak(
                f"row {r}: the student's prompt contains the teacher's privileged context "
                f"({secret[:60]!r}...): the student must never read what only the teacher may see"
            )


def _contains(ids: list[int], sub: list[int]) -> bool:
    n = len(sub)
    return n > 0 and any(ids[i : i + n] == sub for i in range(len(ids) - n + 1))


def rules(config: Any, stage: StageView) -> list[Error]:
    """Privileged context is for a teacher, and `teacher: self` teaches nothing without it."""
    out: list[Error] = []
    if stage.teacher == SELF and config.teacher_context == "none":
        out.append(
            (
                ("teacher",),
                "teacher 'self' is the policy itself, so without privileged context "
                "(train.teacher_context: solution) it would teach nothing",
            )
        )
    if config.teacher_context != "none" and not stage.teacher:
        out.append(
            (("train", "teacher_context"), "privileged context is for a teacher: set teacher (e.g. self)")
        )
    return out


def task_rules(config: Any, tasks: dict[str, Task]) -> list[Error]:
    """The privileged context is added to a single-turn prompt: environment tasks are refused."""
    if config.teacher_context == "none":
        return []
    if envs := [name for name, t in tasks.items() if isinstance(t, EnvTask)]:
        return [(("train", "teacher_context"), f"single-turn tasks only; {envs} are environment tasks")]
    return []


class PrivilegedRun(Hooks):
    """Each step, the teacher's prompt of every row (the solution added), after checking that no
    student prompt of the batch holds its row's privileged text."""

    def __init__(self, run: RunStart):
        self.tokenizer = run.tokenizer
        self.tasks = {t.name: t for t in run.tasks}

    def extras(self, step: Step, batch: Any) -> BatchExtras:
        problems = [r.problem for g in step.local for r in g.rollouts]
        secrets = [privileged_text(self.tasks[p.task], p) for p in problems]
        check_no_leak(self.tokenizer, batch.prompts, secrets)
        return BatchExtras(reference_prompts=teacher_prompts(self.tokenizer, self.tasks, problems))


FEATURE = RLFeature(
    name="teacher_context",
    block=Literal["none", "solution"],
    default="none",
    doc="solution: the reference (the rl stage's teacher, `self` for on-policy self-distillation) reads "
    "each prompt with the task's worked solution added (`temper.train.features.privileged`); the "
    "student never does.",
    order=20,
    rules=rules,
    task_rules=task_rules,
    start=lambda config, run: PrivilegedRun(run) if config.teacher_context == "solution" else None,
)
