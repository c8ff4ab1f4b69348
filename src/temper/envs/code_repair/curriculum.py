"""code_repair's self-evolving curriculum (issue 10 item 4; WebRL, Qi et al. 2024, §3.2): the train
tasks the policy fails become new, admitted variants in the pool (the growth, the bounded-share
draw and the log are `temper.envs.curriculum`'s).

    code_repair: {curriculum: {every: 1, variants_per_failure: 2, max_share: 0.5}}

A variant keeps what the failed task asks for, the same function (its reference source: same
shape, operators and constants) and the same bug family, and changes the bug: a seeded other
rewrite of that family at any of the shape's bug sites, with new seeded test inputs. Why this
rather than a fresh task of the same (shape, family) or a nearby family: WebRL rewrites a failed
instruction into nearby ones so the policy meets the skill it lacks again in other surface
forms; here that skill is "this kind of bug in this function", while a fresh draw of the pair
is as far from the failure as any train task and another family asks for another skill.

Every variant enters only through the fail-to-pass gate (admission.py), rejections counted by
reason; `duplicate` is checked on the buggy source against every split and every earlier variant.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

from temper.envs.code_repair.admission import REASONS, admit
from temper.envs.code_repair.generator import RepairTask, bug_sites, build, mutations, task_of
from temper.envs.curriculum import Curriculum as GrowingPool
from temper.envs.curriculum import CurriculumConfig
from temper.tasks.base import Problem

__all__ = ["CURRICULUM_REASONS", "Curriculum", "CurriculumConfig", "variant"]

CURRICULUM_REASONS = ("no_variant", *REASONS)


def variant(parent: RepairTask, key: str, n_hidden: int = 6) -> RepairTask | None:
    """A seeded variant of `parent` (module docstring): its reference function with another bug
    of its family, new inputs; None when the family has no other rewrite in the function."""
    rng = random.Random(f"code_repair:variant:{key}")
    lines = parent.fixed.rstrip("\n").split("\n")
    sites, arity = bug_sites(parent.shape)
    own = (parent.line - 1, parent.buggy.rstrip("\n").split("\n")[parent.line - 1])
    choices = [(i, m) for i in sites for m in mutations(parent.family, lines[i]) if (i, m) != own]
    if not choices:
        return None
    i, mutated = rng.choice(choices)
    return build(parent.shape, parent.family, lines, i, mutated, arity, rng, n_hidden)


class Curriculum(GrowingPool):
    """The growing train pool of one CodeRepairTask (module docstring)."""

    reasons = REASONS

    def parent(self, problem: Problem) -> RepairTask:
        return task_of(problem)

    def make_variant(self, parent: RepairTask, key: str) -> RepairTask | None:
        """One variant candidate (a method, so a test can plant a bad one)."""
        return variant(parent, key, self.task.config.n_hidden)

    def gate(self, candidates: list[RepairTask], seen: set[str]) -> tuple[list[RepairTask], dict[str, int]]:
        out = admit(candidates, len(candidates), seen=seen, max_candidates=len(candidates),
                    unsafe=self.task.config.unsafe)  # fmt: skip
        return out.tasks, out.counts

    def candidate_key(self, candidate: RepairTask) -> str:
        return candidate.buggy

    def candidate_data(self, candidate: RepairTask) -> dict[str, Any]:
        return asdict(candidate)

    def known_keys(self) -> set[str]:
        return {t.buggy for a in self.task.admitted().values() for t in a.tasks}

    def generated_key(self, problem: Problem) -> str:
        return problem.data["buggy"]
