"""The overfitting check of a supervised stage: held-out loss rising while the train loss falls.

A model that starts memorizing its training rows keeps lowering its train loss while the loss on
held-out rows stops falling and climbs (the demo's SFT: train loss 0.015, held-out 0.43-0.48 and
rising at the end). From the held-out evaluations of a run's metrics (`eval_loss`, or `eval/loss`
for the preference trainers) and its train losses:

    flag  iff  at least MIN_EVALS held-out evaluations,
               the latest one L_t at least RISE above the lowest one before it L_b (L_t >= (1 + RISE) L_b),
               and the train loss fell since: mean of the last SMOOTH train losses logged by step t
               < the same mean at step b.

Like the reward-hacking monitors (`temper.rewards.monitors`) it is an alarm to read the curves,
computed from the numbers in metrics.jsonl (so a resumed run gives the same answer): the
remedies are fewer steps, more or more varied data, or an earlier checkpoint (`select`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.jsonl import iter_jsonl

MIN_EVALS = 3
"""Held-out evaluations needed: with two, a rise cannot be told from one noisy point."""
RISE = 0.03
"""How far above its lowest value the latest held-out loss must be (relative)."""
SMOOTH = 3
"""Train losses averaged at each end: one logged batch's loss is noisy."""
HELD_OUT_KEYS = ("eval_loss", "eval/loss")


@dataclass(frozen=True)
class Overfitting:
    """The check at the latest held-out evaluation of a run."""

    best_step: int
    best: float
    """The lowest held-out loss, at `best_step` (the earliest, on ties)."""
    last_step: int
    last: float
    """The latest held-out loss."""
    train_at_best: float
    train_last: float
    """Mean of the last SMOOTH train losses logged by `best_step` and by `last_step`."""

    @property
    def rise(self) -> float:
        """(last - best) / best: how far the held-out loss climbed from its lowest."""
        if self.best > 0:
            return (self.last - self.best) / self.best
        return math.inf if self.last > self.best else 0.0

    @property
    def flagged(self) -> bool:
        return self.last_step != self.best_step and self.rise >= RISE and self.train_last < self.train_at_best

    def describe(self) -> str:
        """One line: what the held-out and train losses did, and what a flag suggests."""
        held = (
            f"held-out loss {self.best:.3g} at step {self.best_step} -> {self.last:.3g} at step "
            f"{self.last_step} ({self.rise:+.1%})"
        )
        train = f"train loss {self.train_at_best:.3g} -> {self.train_last:.3g}"
        if not self.flagged:
            return f"{held}, {train}"
        return (
            f"{held} while the {train}: the model is memorizing its training rows (overfitting); "
            "fewer steps, more data or an earlier checkpoint should generalize better"
        )


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _held_out(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    key = next((k for k in HELD_OUT_KEYS if any(_finite(r.get(k)) for r in rows)), None)
    return [(r["step"], float(r[key])) for r in rows if key and _finite(r.get(key))]


def _train_mean(rows: Sequence[Mapping[str, Any]], step: int) -> float | None:
    losses = [float(r["loss"]) for r in rows if r["step"] <= step and _finite(r.get("loss"))][-SMOOTH:]
    return sum(losses) / len(losses) if losses else None


def check(rows: Sequence[Mapping[str, Any]]) -> Overfitting | None:
    """The check over `rows` (metrics rows, in step order); None with fewer than MIN_EVALS
    held-out evaluations or no train loss."""
    held = _held_out(rows)
    if len(held) < MIN_EVALS:
        return None
    best_step, best = min(held, key=lambda p: p[1])
    last_step, last = held[-1]
    at_best, at_last = _train_mean(rows, best_step), _train_mean(rows, last_step)
    if at_best is None or at_last is None:
        return None
    return Overfitting(best_step, best, last_step, last, at_best, at_last)


def first_flagged(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """The first held-out evaluation's step at which the check (over the rows up to it) flags."""
    for step, _ in _held_out(rows):
        found = check([r for r in rows if r["step"] <= step])
        if found is not None and found.flagged:
            return step
    return None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The readable rows of a metrics.jsonl (a torn or bad line is skipped: this only warns)."""
    if not path.is_file():
        return []
    return [r for _, _, r in iter_jsonl(path) if isinstance(r, dict) and isinstance(r.get("step"), int)]


def warning(metrics: Path) -> str | None:
    """What a flagged run's metrics.jsonl says (`Overfitting.describe`), or None."""
    found = check(read_rows(metrics))
    return found.describe() if found is not None and found.flagged else None


def warn(metrics: Path, stage: str) -> None:
    """Say on the console, at the end of a stage's training, when its metrics flag overfitting."""
    if said := warning(metrics):
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True, soft_wrap=True).print(f"[yellow]warning[/]: {escape(stage)}: {escape(said)}")
