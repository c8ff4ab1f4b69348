"""Verifiable single-turn tasks, looked up by name from recipes."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.tasks.base import Problem, Score, Task
from temper.tasks.general_points import GeneralPoints, GeneralPointsConfig

TASKS: dict[str, type] = {"arithmetic": Arithmetic, "general_points": GeneralPoints}

__all__ = [
    "TASKS",
    "make_recipe_task",
    "Arithmetic",
    "ArithmeticConfig",
    "GeneralPoints",
    "GeneralPointsConfig",
    "Problem",
    "Score",
    "Task",
    "make_task",
]


def make_task(name: str, **options: Any) -> Task:
    """The task `name` configured by `options` (its config's fields); errors suggest the nearest."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}{_hint(name, TASKS)}; valid tasks: {', '.join(TASKS)}")
    cls = TASKS[name]
    fields = [f.name for f in dataclasses.fields(cls.config_type)]
    for option in options:
        if option not in fields:
            raise ValueError(
                f"unknown option {option!r} for task {name!r}{_hint(option, fields)}; "
                f"valid options: {', '.join(fields)}"
            )
    return cls(cls.config_type(**options))


def make_recipe_task(name: str, options: dict[str, Any]) -> Task:
    """A recipe's task entry. The key is the task's name in the recipe; `task:` picks the
    built-in it configures, so one recipe can hold variants (`add_sub: {task: arithmetic,
    ops: [+, -]}`) next to the task itself."""
    options = dict(options)
    return make_task(options.pop("task", name), **options)


def _hint(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
