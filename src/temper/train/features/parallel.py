"""The parallel-decomposition reward of orchestrator RL (PARL, Kimi K2.5), the feature
`parallel: {weight, anneal_steps, schedule, unused_penalty}` (`temper.rewards.parallel` holds the
spec and the formula): each episode's term w(t) * m * [unused = 0] - c * unused share is added
to its final reward as it is graded (`shape`, with the step's w(t)), before the group's
zero-variance cause is read. parts["parallel"] is m, parts["parallel_weight"] w(t).

Only the orchestrator's tokens are trained: the sub-agents' results come back as the env's
observation (`temper.envs.orchestrator`), environment tokens the agent loop masks. The step's
metrics (`parallel/*`): w(t), and per episode the mean critical path, total steps, sub-agents,
spawn turns and m.
"""

from __future__ import annotations

from typing import Any

from temper.rewards.parallel import ParallelSpec, parallel_errors, parallel_term, weight_at
from temper.rewards.path import episode_totals
from temper.train.features.base import Hooks, RLFeature, RunStart, Step, at


def parallel_shaper(spec: ParallelSpec, step: int):
    """A group's rollouts -> per episode (parts, the parallel term at `step`)."""

    def shape(rollouts: list[Any]) -> list[tuple[dict[str, float], float]]:
        return [parallel_term(episode_totals(r.trajectory.signals), spec, step) for r in rollouts]

    return shape


class ParallelMetrics(Hooks):
    """The step's w(t) and its episodes' critical path and total steps (means per episode)."""

    def __init__(self, spec: ParallelSpec):
        self.spec = spec

    def after_grading(self, step: Step) -> dict[str, Any]:
        row: dict[str, Any] = {"parallel/weight": weight_at(self.spec, step.step)}
        totals = [episode_totals(r.trajectory.signals) for g in step.groups for r in g.rollouts]
        if not totals:
            return row
        for key, name in (("critical_steps", "critical_path"), ("steps", "total_steps"),
                          ("subagents", "subagents"), ("spawns", "spawns"), ("unused", "unused")):  # fmt: skip
            row[f"parallel/{name}"] = sum(t.get(key, 0.0) for t in totals) / len(totals)
        parts = [r.parts.get("parallel", 0.0) for g in step.groups for r in g.rollouts]
        row["parallel/measure"] = sum(parts) / len(parts)
        return row


def start(config: Any, run: RunStart) -> ParallelMetrics | None:
    return ParallelMetrics(config.parallel) if config.parallel is not None else None


def _describe(config: Any) -> str:
    p = config.parallel
    if p is None:
        return ""
    how = (
        "constant"
        if p.schedule == "constant" or p.anneal_steps == 0
        else f"annealed over {p.anneal_steps} steps"
    )
    return f", parallel reward {p.weight:g} ({how}, unused penalty {p.unused_penalty:g})"


FEATURE = RLFeature(
    name="parallel",
    block=ParallelSpec | None,
    doc="Orchestrator RL's parallel reward (PARL, `temper.rewards.parallel`): {weight, anneal_steps, "
    "schedule: linear | constant, unused_penalty}; w(t) * (1 - critical path / total steps), paid only "
    "to an episode that answered using every sub-agent result, minus unused_penalty x the unused share. "
    "null: off.",
    order=45,
    rules=lambda config, stage: at(("train",), parallel_errors(config.parallel, config.rewards)),
    describe=_describe,
    shape=lambda config, step: (
        parallel_shaper(config.parallel, step) if config.parallel is not None else None
    ),
    start=start,
    hashed_when_set=True,  # added after runs were recorded: their stage hashes stay as they were
)
