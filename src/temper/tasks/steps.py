"""Step labels from program verification: which steps of a worked solution are right.

A process reward model (Lightman et al. 2023, "Let's Verify Step by Step", arXiv:2305.20050)
learns one label per step instead of one per solution. Their labels came from people; on a task
whose intermediate steps a program can check, they come from the program. GeneralPoints is such a
task: its demonstration is a chain of pairwise equations over the cards, then the answer line,

    10-1=9, 9*8=72, 72/3=24
    Answer: (10-1)*8/3

and each equation can be checked against the state the earlier ones left (the multiset of values
still on the table). A completion is cut into steps by `segment`:

- equation steps: the first line, split at commas (each span stripped of spaces); none when the
  first line already is the `Answer:` line;
- the outcome step: everything after the first line, up to the end of the completion. Its last
  token is the completion's last token (the end-of-turn token when there is one), so the outcome
  label never shares a token with an equation's. A completion with no second line (cut off, or no
  answer) still has one: its grade is the task's, `no_answer`.

`general_points_labels` grades the steps in order. An equation step `x op y=z` is good when

1. it parses: operands are naturals or parenthesized fractions/negatives, as the solver writes
   them (`8/(1/3)`'s step is `8/(1/3)=24`), the result a plain number;        else `malformed`
2. x and y are both on the table (each used once);                          else `unavailable_operand`
3. x op y equals z exactly (rationals; a division by zero is wrong);       else `wrong_result`
4. the target can still be made from the table after x, y are replaced by z; else `dead_end`

and `valid` otherwise; the outcome step is good when the task's `score` says correct, and its
reason is the score's. Rule 4 makes the labels about progress, not only arithmetic: `3*8=24` on
the hand 3 8 5 7 is true but leaves 24 5 7, from which 24 cannot be made, so the solution has
already failed there. The solver's own reachability test (`general_points.solvable`) decides it.

First error (Lightman et al. 2023, section 2.4 and PRM800K's labelling, which stops at the first
mistake): the steps after the first bad one get no label (`IGNORE`, reason `after_error`) rather
than "bad". After a wrong step the table the later equations are checked against no longer
exists (which 72 does `72/3=24` use if `9*8=71` came first?), so any label there would be a
guess; and a "bad" label on a later, locally sound step would teach the model that sound steps
are bad. At scoring time every step is still scored; a solution's score aggregates them
(`temper.rewards.process_reward_model.aggregate`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from temper.labels import IGNORE  # the label of a step after the first error (as the loss masks)
from temper.tasks.base import Problem, Task
from temper.tasks.general_points import solvable

EQUATION_REASONS = ("valid", "malformed", "unavailable_operand", "wrong_result", "dead_end")

_OPERAND = r"(\d+|\(-?\d+(?:/\d+)?\))"
_EQUATION = re.compile(rf"{_OPERAND}\s*([-+*/])\s*{_OPERAND}\s*=\s*(-?\d+(?:/\d+)?)")


@dataclass(frozen=True)
class Span:
    """A step's characters in the completion text: text[start:end]; `outcome` for the last step."""

    start: int
    end: int
    outcome: bool = False


@dataclass(frozen=True)
class StepLabel:
    """label: 1 good, 0 bad, IGNORE after the first error; reason: why (see the module docstring)."""

    label: int
    reason: str


def segment(completion: str) -> list[Span]:
    """The steps of a completion: the equations of its first line, then the outcome step (always
    present, ending at the completion's end; possibly empty). See the module docstring."""
    newline = completion.find("\n")
    head_end = len(completion) if newline < 0 else newline
    spans: list[Span] = []
    if not completion[:head_end].lstrip().startswith("Answer:"):
        at = 0
        for piece in completion[:head_end].split(","):
            stripped = piece.strip()
            if stripped:
                start = at + piece.index(stripped)
                spans.append(Span(start, start + len(stripped)))
            at += len(piece) + 1
        outcome_start = head_end
    else:
        outcome_start = 0
    return [*spans, Span(outcome_start, len(completion), outcome=True)]


def _value(text: str) -> Fraction:
    return Fraction(text.strip("()"))


def _apply(x: Fraction, op: str, y: Fraction) -> Fraction | None:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return None if y == 0 else x / y


def _reachable(table: list[Fraction], target: int) -> bool:
    return table == [target] if len(table) == 1 else solvable(table, target)


def check_equation(step: str, table: list[Fraction], target: int) -> tuple[str, list[Fraction]]:
    """(reason, the table after the step) of one equation step on `table` (see the module
    docstring for the rules); the table is unchanged unless the step is valid."""
    match = _EQUATION.fullmatch(step.strip())
    if match is None:
        return "malformed", table
    x, op, y, z = _value(match[1]), match[2], _value(match[3]), Fraction(match[4])
    rest = list(table)
    for operand in (x, y):
        if operand not in rest:
            return "unavailable_operand", table
        rest.remove(operand)
    if _apply(x, op, y) != z:
        return "wrong_result", table
    after = sorted([*rest, z])
    if not _reachable(after, target):
        return "dead_end", table
    return "valid", after


def general_points_labels(
    task: Task, problem: Problem, completion: str, spans: list[Span]
) -> list[StepLabel]:
    """One label per span of `segment(completion)`, first-error style (see the module docstring)."""
    table = sorted(Fraction(v) for v in problem.data["values"])
    target = problem.data["target"]
    out: list[StepLabel] = []
    failed = False
    for span in spans:
        if failed:
            out.append(StepLabel(IGNORE, "after_error"))
            continue
        if span.outcome:
            score = task.score(problem, completion)
            reason = score.details.get("reason", "correct" if score.correct else "wrong")
            out.append(StepLabel(int(score.correct), reason))
            continue
        reason, table = check_equation(completion[span.start : span.end], table, target)
        failed = reason != "valid"
        out.append(StepLabel(int(not failed), reason))
    return out


StepLabeller = Callable[[Task, Problem, str, list[Span]], list[StepLabel]]

STEP_LABELLERS: dict[str, StepLabeller] = {"general_points": general_points_labels}
"""Tasks whose solutions have program-checkable steps, by task name."""


def label_steps(task: Task, problem: Problem, completion: str) -> tuple[list[Span], list[StepLabel]]:
    """(spans, labels) of a completion of `task`; ValueError for a task without a step labeller."""
    labeller = STEP_LABELLERS.get(task.name)
    if labeller is None:
        raise ValueError(
            f"task {task.name!r} has no step labeller; process reward models can train on: {', '.join(STEP_LABELLERS)}"
        )
    spans = segment(completion)
    return spans, labeller(task, problem, completion, spans)
