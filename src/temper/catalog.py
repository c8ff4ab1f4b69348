"""Every task kind by name, as recipes, stages and commands look them up: the single-turn tasks of
`temper.tasks` and the environment tasks of `temper.envs` (a Task with `make_env`: multi-turn
episodes). It sits right above the envs, so `temper.tasks` never names an environment and every
layer above the envs (the recipe's validation, the stages, the runner) can build a task by name."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from temper.envs.calculator import CalculatorArithmetic
from temper.envs.code_repair.task import CodeRepairTask
from temper.envs.gateway_env import GatewayTask
from temper.envs.memory_corridor import MemoryCorridorTask
from temper.envs.multi_tool import MultiToolTask
from temper.envs.orchestrator import OrchestratorTask
from temper.envs.prune_lookup import PruneLookupTask
from temper.envs.shell_repo.task import ShellRepoTask
from temper.envs.simulated_search import SearchDocumentsTask, SimulatedSearchTask
from temper.envs.treasure_task import TreasureHuntTask
from temper.envs.user_env import EnvDataTask
from temper.envs.web_shop.task import WebShopTask
from temper.tasks.arithmetic import Arithmetic
from temper.tasks.base import BuiltFromRecipe, Fingerprinted, Task, WrapsTask
from temper.tasks.dataset_task import DataTask
from temper.tasks.general_points import GeneralPoints
from temper.tasks.instructed import InstructedArithmetic
from temper.tasks.reasoning_gym_task import ReasoningGym
from temper.tasks.thinking_language import ThinkingLanguage
from temper.tasks.translated import Translated
from temper.tasks.two_mode import TwoMode

TASKS: dict[str, type] = {
    "arithmetic": Arithmetic,
    "general_points": GeneralPoints,
    "dataset": DataTask,  # the user's rows and reward functions
    "reasoning_gym": ReasoningGym,  # any reasoning-gym data set (needs the reasoning_gym extra)
    "two_mode": TwoMode,  # a task's demonstrations in a thinking and a direct mode (AdaptThink)
    "instructed_arithmetic": InstructedArithmetic,  # a house rule in a system prompt (prompt distillation)
    "translated": Translated,  # a task in a synthetic language (another script and word order)
    "thinking_language": ThinkingLanguage,  # the trace in the language a system prompt names
}

ENVIRONMENT_TASKS: dict[str, type] = {
    "calculator_arithmetic": CalculatorArithmetic,
    "code_repair": CodeRepairTask,
    "treasure_hunt": TreasureHuntTask,
    "multi_tool": MultiToolTask,  # tools with costs and dependencies, local or MCP
    "simulated_search": SimulatedSearchTask,
    "search_documents": SearchDocumentsTask,  # its simulator's SFT task
    "orchestrator": OrchestratorTask,  # sub-tasks delegated to parallel scripted sub-agents (PARL)
    "gateway": GatewayTask,  # the user's openai-client agent script, through the gateway
    "memory_corridor": MemoryCorridorTask,  # a fact seen early, needed late, under a context budget
    "prune_lookup": PruneLookupTask,  # retrieval under a hard context budget, pruning as an action
    "shell_repo": ShellRepoTask,  # a real shell in the sandbox on multi-file repositories, fail-to-pass
    "web_shop": WebShopTask,  # a browser agent on a local shop served per episode (WebRL curriculum)
}
"""Environment tasks (a Task with `make_env`: multi-turn episodes)."""

TASKS.update(ENVIRONMENT_TASKS)

__all__ = ["ENVIRONMENT_TASKS", "TASKS", "make_recipe_task", "make_task", "task_fingerprints"]


def make_task(name: str, *, label: str | None = None, base_dir: Path | None = None, **options: Any) -> Task:
    """The task `name` configured by `options` (its config's fields); errors suggest the nearest.
    A kind with a `build` classmethod (one read from files: `dataset`) also gets its recipe
    `label` and the folder its relative paths resolve against; one with a `wrap` classmethod (a
    task over another: `two_mode`) gets its base task, built here from its `base` and `options`.
    A `dataset` entry that names an `env:` or an `environment_factory:` is played as the user's
    environment (`EnvDataTask`)."""
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
    config = cls.config_type(**options)
    if cls is DataTask and (config.env or config.environment_factory):
        cls = EnvDataTask
    if isinstance(cls, WrapsTask):
        return cls.wrap(
            config, label or name, lambda: make_task(config.base, base_dir=base_dir, **config.options)
        )
    if isinstance(cls, BuiltFromRecipe):
        return cls.build(config, name=label or name, base_dir=base_dir)
    return cls(config)


def make_recipe_task(name: str, options: dict[str, Any], base_dir: Path | None = None) -> Task:
    """A recipe's task entry. The key is the task's name in the recipe; `task:` picks the
    built-in it configures, so one recipe can hold variants (`add_sub: {task: arithmetic,
    ops: [+, -]}`) next to the task itself. `base_dir` (the recipe's folder; default the working
    directory) is where a task's relative paths (`data:`, a reward module) resolve."""
    options = dict(options)
    return make_task(options.pop("task", name), label=name, base_dir=base_dir, **options)


def task_fingerprints(tasks: dict[str, Task]) -> dict[str, str]:
    """name -> digest of what a task reads beyond its options (data rows, reward code), for the
    tasks that have one: a stage's settings hash covers it, so editing the data reruns the stage."""
    return {name: t.fingerprint() for name, t in tasks.items() if isinstance(t, Fingerprinted)}


def _hint(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
