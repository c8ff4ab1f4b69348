"""Tasks played one command per turn with a scripted expert (code_repair, shell_repo): the
demonstrations, the whole-list scoring and the play loop they share.

A task using `PlaysCommands` defines `commands(problem, variant) -> [command]` (the expert's
script of a demonstration variant), `variant(problem)` (which variant a problem gets),
`make_env(problem)` and `max_turns` (the most commands an episode takes). Demonstrations are
played through the real env, so their observations, signals and outcome are the env's own; a
demonstration that does not end as its variant must (`variant_ends`, by default VARIANT_ENDS: a
repair passes, an edited test is void) is a bug of the script and raises.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temper.envs.base import StepResult
from temper.tasks.base import Problem, Score

VARIANT_ENDS = {"repair": ("pass",), "skip_run": ("pass",), "edit_test": ("void_rule_broken",)}
"""The outcome reasons each demonstration variant may end with."""


class PlaysCommands:
    """Mixin of a command-per-turn environment task (module docstring)."""

    variant_ends: dict[str, tuple[str, ...]] = VARIANT_ENDS

    def play(self, problem: Problem, commands: list[str]) -> tuple[list[dict[str, Any]], list[StepResult]]:
        """Play `commands` through a fresh env: the conversation and each step's result."""
        env = self.make_env(problem)
        messages = env.reset()
        results = []
        try:
            for command in commands:
                messages.append({"role": "assistant", "content": command})
                result = env.step(command)
                results.append(result)
                messages += result.messages
                if result.done:
                    break
        finally:
            env.close()
        return messages, results

    def demonstration_messages(self, problem: Problem) -> list[dict[str, Any]]:
        """The scripted episode of `problem`'s variant, played through the env; train problems are
        played all at once (a few at a time) on first use and cached."""
        if problem.split == "train":
            return _train_demos(self)[problem.id]
        return self._demo(problem)

    def _demo(self, problem: Problem) -> list[dict[str, Any]]:
        variant = self.variant(problem)
        messages, results = self.play(problem, self.commands(problem, variant))
        score = results[-1].score
        if not results[-1].done or score is None or score.details["reason"] not in self.variant_ends[variant]:
            raise AssertionError(f"the {variant} demonstration of {problem.id} ended {score}")  # a bug
        return messages

    def demonstration(self, problem: Problem) -> str:
        """The repair's commands, one per line (what `score` plays)."""
        return "\n".join(self.commands(problem))

    def score(self, problem: Problem, completion: str) -> Score:
        """A whole command list at once: each non-empty line is one command, played until the
        episode ends (a list without submit ends at the command limit: outcome 0)."""
        lines = [ln for ln in completion.splitlines() if ln.strip()][: self.max_turns]
        _, results = self.play(problem, lines)
        if not results or not results[-1].done:
            return Score(0.0, False, False, {"reason": "no_submit", "commands": len(results)})
        return results[-1].score


@functools.cache
def _train_demos(task: PlaysCommands) -> dict[str, list[dict[str, Any]]]:
    problems = task.problems("train")
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip((p.id for p in problems), pool.map(task._demo, problems), strict=True))
