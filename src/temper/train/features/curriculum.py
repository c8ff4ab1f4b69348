"""Curriculum growth as an RL feature, without a block of its own: a task with a
`failure_curriculum` (`code_repair`'s and `web_shop`'s `curriculum:` option, `temper.envs.curriculum`)
grows its train pool from the problems whose whole group failed. After each step every process's
graded problems (all sampling rounds, the dropped groups too) are gathered, each with whether its
whole group failed, and handed to its task's curriculum, which grows its pool from the failures
(the same pool in every process; `curriculum/*` metrics). A resumed run replays the curriculum's
log up to the step it resumes from.
"""

from __future__ import annotations

from typing import Any

from temper import distributed
from temper.tasks.base import curriculum_of
from temper.train.features.base import Hooks, RLFeature, RunStart, Step


class Curricula(Hooks):
    def __init__(self, curricula: dict[str, Any], run: RunStart):
        self.curricula = curricula
        for curriculum in curricula.values():
            curriculum.resume(run.out_dir, run.start, run.main)

    def after_grading(self, step: Step) -> dict[str, Any]:
        return grow_curricula(self.curricula, step.graded, step.step)


def grow_curricula(curricula: dict[str, Any], graded: list[Any], step: int) -> dict[str, float]:
    """Every process's graded problems of the (1-based) step, gathered, each with whether its
    whole group failed, handed to its task's curriculum; the curricula's metrics."""
    drawn = distributed.gather([
        (g.rollouts[0].problem.task, g.rollouts[0].problem.id, not any(r.score.correct for r in g.rollouts))
        for g in graded if g.rollouts
    ])  # fmt: skip
    row: dict[str, float] = {}
    for name, curriculum in curricula.items():
        row |= curriculum.after_step(step, [(pid, failed) for task, pid, failed in drawn if task == name])
    return row


def start(config: Any, run: RunStart) -> Curricula | None:
    curricula = {t.name: c for t in run.tasks if (c := curriculum_of(t)) is not None}
    return Curricula(curricula, run) if curricula else None


FEATURE = RLFeature(name="curriculum", order=50, start=start)
