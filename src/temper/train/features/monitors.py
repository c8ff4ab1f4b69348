"""The reward-hacking monitors as an RL feature, `monitors: {enabled, window, ...}` (the monitors
themselves are `temper.rewards.monitors`): every step, from the step's samples and a trailing
window of the logged rows, `monitor/<name>` and `monitor/<name>/flag`; the first flag of each
monitor is said on the console. A resumed run reads its window back from the log, so it
recomputes the same values.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console

from temper.rewards import monitors
from temper.rewards.monitors import MonitorConfig
from temper.tasks.base import path_signals_of
from temper.train.features.base import Error, Hooks, RLFeature, RunStart, Step

console = Console(stderr=True)


def rules(config: Any, stage: Any) -> list[Error]:
    m = config.monitors
    if m.enabled and m.min_steps > m.window:
        return [
            (
                ("train", "monitors", "min_steps"),
                f"{m.min_steps} must be at most monitors.window ({m.window}): no monitor could ever flag",
            )
        ]
    return []


class Monitors(Hooks):
    """The monitors' window and the monitors that flagged so far."""

    def __init__(self, config: MonitorConfig, run: RunStart):
        self.config, self.main = config, run.main
        self.past = list(run.past)
        self.flagged: set[str] = set()
        for row in self.past:
            monitors.new_flags(row, self.flagged)
        self.violations = [
            n for t in run.tasks for n, kind in path_signals_of(t).items() if kind == "violation"
        ]

    def after_step(self, step: Step, row: dict[str, Any]) -> dict[str, Any]:
        done = [r for g in step.groups for r in g.rollouts]
        out = monitors.step_monitors(
            row, self.past, [r.reward for r in done], [r.tokens for r in done], self.config, self.violations
        )
        full = {**row, **out}
        self.past = [*self.past[-self.config.window :], full]
        for name in monitors.new_flags(full, self.flagged):
            if self.main:
                console.print(
                    f"[yellow]rl[/]: step {step.step}: reward-hacking monitor {name} flagged "
                    f"({full.get('monitor/' + name, float('nan')):.3g}): {monitors.meaning(name)}"
                )
        return out


FEATURE = RLFeature(
    name="monitors",
    block=MonitorConfig,
    default=MonitorConfig,
    doc="Reward-hacking monitors (`temper.rewards.monitors`): length correlation, train vs gold "
    "divergence, component trends, violation rate; logged as monitor/<name> and monitor/<name>/flag.",
    order=90,
    rules=rules,
    summary=lambda config, folder: {"monitors": asdict(config.monitors)},  # the report's thresholds
    start=lambda config, run: Monitors(config.monitors, run) if config.monitors.enabled else None,
)
