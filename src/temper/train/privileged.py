"""On-policy self-distillation (OPSD): the teacher is the policy itself with privileged context
(the worked solution) in its prompt; the student, the same weights, never sees it.

Each sampled completion is scored twice: by the student on its own prompt (the policy update) and
by the teacher on the prompt with the solution added (the reference forward of `rl_update.prepare`),
so the per-token advantage of `on_policy_distill` is log pi(y_t | x, solution) - log pi(y_t | x).
Everything hinges on the student never reading the solution, so `check_no_leak` verifies it on the
exact token ids the update reads, every step (our own check; a leak would make the teacher's
advantage vanish and the student learn to copy context it will not have at test time).
"""

from __future__ import annotations

from typing import Any

from temper.data.chat import prompt_ids
from temper.tasks.base import Problem, Task

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
