"""Verified path rewards (RLVP), the feature `path: {beta, rules, milestones}`
(`temper.rewards.path` holds the spec, Phi and its rules): each episode's path score Phi is
z-scored within its group alone, apart from the outcome, and beta x z is added to its final
reward before the group's zero-variance cause is read (`shape`): an all-wrong group whose path
scores differ has a signal. parts["path"] is the raw Phi and parts["path_norm"] z, so the outcome
and the path are visible apart. The path term is credited where the outcome is, at the end.

Whenever the tasks declare path signals the run logs the path metrics (violations per episode,
compliance rate, path/phi with a spec, path/all_fail_groups), with or without a path reward: an
outcome-only run is compared on them.
"""

from __future__ import annotations

from typing import Any

from temper.rewards.path import (
    PathSpec,
    declared_signals,
    episode_totals,
    normalize_in_group,
    path_errors,
    path_metrics,
    phi,
    signal_errors,
)
from temper.train.features.base import Hooks, RLFeature, RunStart, Step, at


def path_shaper(spec: PathSpec):
    """A group's rollouts -> per episode ({path: Phi, path_norm: z}, beta x z)."""

    def shape(rollouts: list[Any]) -> list[tuple[dict[str, float], float]]:
        phis = [phi(episode_totals(r.trajectory.signals), spec) for r in rollouts]
        zs = normalize_in_group(phis, spec.eps)
        return [({"path": raw, "path_norm": z}, spec.beta * z) for raw, z in zip(phis, zs, strict=True)]

    return shape


class PathMetrics(Hooks):
    """The step's path metrics over its trained groups (`temper.rewards.path.path_metrics`)."""

    def __init__(self, kinds: dict[str, str], with_spec: bool):
        self.kinds, self.with_spec = kinds, with_spec

    def after_grading(self, step: Step) -> dict[str, Any]:
        if not step.groups:
            return {}
        rollouts = [r for g in step.groups for r in g.rollouts]
        totals = [episode_totals(r.trajectory.signals) for r in rollouts]
        phis = [r.parts["path"] for r in rollouts] if self.with_spec else None
        row = path_metrics(totals, self.kinds, phis)
        row["path/all_fail_groups"] = sum(g.outcome_all_fail for g in step.groups) / len(step.groups)
        return row


def start(config: Any, run: RunStart) -> PathMetrics | None:
    kinds = declared_signals(run.tasks)[0]
    return PathMetrics(kinds, config.path is not None) if kinds else None


def _describe(config: Any) -> str:
    p = config.path
    return (
        f", path reward beta {p.beta:g} ({len(p.rules)} rules, {len(p.milestones)} milestones)" if p else ""
    )


FEATURE = RLFeature(
    name="path",
    block=PathSpec | None,
    doc="Verified path rewards (RLVP, `temper.rewards.path`): {beta, rules: [{violation, penalty, "
    "compliance, reward}], milestones: {signal: weight}}; Phi is z-scored within each group apart "
    "from the outcome and added as beta x z. null: outcome (and the other components) only.",
    order=40,
    rules=lambda config, stage: at(("train",), path_errors(config.path, config.rewards)),
    task_rules=lambda config, tasks: at(("train",), signal_errors(config.path, config.rewards, tasks)),
    describe=_describe,
    shape=lambda config, step: path_shaper(config.path) if config.path is not None else None,
    start=start,
)
