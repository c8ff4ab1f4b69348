"""The registry of RL features: every module of this package that defines `FEATURE`.

Found by listing the package, as stage kinds are (`temper.stages.registry`), so adding a feature
is adding its module and its test. Here the features' parts are put together for the rest of the
code: their blocks become fields of `RLConfig` (`with_feature_blocks`), their rules one list
(`rules`, `task_rules`: the recipe's check), their scorers one dict, their hooks one `Features`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from temper.train.features.base import (
    BatchExtras,
    Error,
    Hooks,
    RLFeature,
    RunStart,
    ScorerSetup,
    StageView,
    Step,
    Use,
    at,
)

__all__ = [
    "BLOCKS",
    "FEATURES",
    "BatchExtras",
    "Features",
    "Hooks",
    "RLFeature",
    "RunStart",
    "ScorerSetup",
    "StageView",
    "Step",
    "at",
    "describe",
    "hashed",
    "moved",
    "rules",
    "scorers",
    "shapers",
    "start",
    "summary",
    "task_rules",
    "uses",
    "with_feature_blocks",
]


def _discover() -> tuple[RLFeature, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        feature = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FEATURE", None)
        if isinstance(feature, RLFeature):
            found.append(feature)
    names = [f.name for f in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two RL features share a name: {sorted(names)}")
    return tuple(sorted(found, key=lambda f: (f.order, f.name)))


FEATURES: tuple[RLFeature, ...] = _discover()
"""Every feature, in the order their hooks run."""
BLOCKS: tuple[RLFeature, ...] = tuple(f for f in FEATURES if f.block is not None)
"""The features with a settings block (a key of `train:`)."""


def with_feature_blocks(cls: type) -> type:
    """Add one field per feature to the (not yet dataclass) class `cls`: its block, under its key,
    with its default and description. Applied under `@dataclass` to `RLConfig`."""
    for f in BLOCKS:
        if f.name in cls.__annotations__:
            raise RuntimeError(f"RL feature {f.name!r} shadows a core setting")
        cls.__annotations__[f.name] = Annotated[f.block, Field(description=f.doc)]
        default = dataclasses.field(default_factory=f.default) if callable(f.default) else f.default
        setattr(cls, f.name, default)
    return cls


def rules(config: Any, stage: StageView | None = None) -> list[Error]:
    """Every feature's rules of a `train:` block, located below the stage."""
    stage = stage or StageView()
    return [e for f in FEATURES for e in f.rules(config, stage)]


def moved(train: Any) -> list[Error]:
    """The keys of a raw `train:` mapping written as they were before a feature's block replaced
    them, with the form to write instead, located below the stage."""
    return [e for f in FEATURES for e in f.moved(train)] if isinstance(train, dict) else []


def task_rules(config: Any, tasks: dict[str, Any]) -> list[Error]:
    """Every feature's rules that need the stage's built tasks, located below the stage."""
    return [e for f in FEATURES for e in f.task_rules(config, tasks)]


def uses(config: Any) -> list[Use]:
    """What the features' blocks read (the stage hash covers it)."""
    return [u for f in FEATURES for u in f.uses(config)]


def describe(config: Any) -> str:
    """The features' parts of the stage's plan line."""
    return "".join(f.describe(config) for f in FEATURES)


def summary(config: Any, folder: Any) -> dict[str, Any]:
    """The features' entries of the stage's rl.json."""
    out: dict[str, Any] = {}
    for f in FEATURES:
        out |= f.summary(config, folder)
    return out


def hashed(config: Any) -> tuple[set[str], dict[str, Any]]:
    """(the feature blocks the stage hash leaves out of the dump, the `train:` keys it covers
    instead): a block with a `hashed` form is replaced by that form, and a `hashed_when_set` block
    at its default is left out."""
    replaced: dict[str, Any] = {}
    dropped: set[str] = set()
    for f in BLOCKS:
        block = getattr(config, f.name)
        default = f.default() if callable(f.default) else f.default
        if f.hashed is not None:
            dropped.add(f.name)
            replaced |= f.hashed(config)
        elif f.hashed_when_set and block == default:
            dropped.add(f.name)
    return dropped, replaced


def scorers(config: Any, setup: ScorerSetup) -> dict[str, Any]:
    """The batch reward scorers of the features `config` uses, by component name."""
    out: dict[str, Any] = {}
    for f in FEATURES:
        if f.scorers is not None:
            out |= f.scorers(config, setup)
    return out


def shapers(config: Any, step: int) -> list[Any]:
    """The features' terms of a group's rewards at the 1-based `step` (applied in order when a
    group is graded)."""
    return [s for f in FEATURES if f.shape is not None and (s := f.shape(config, step)) is not None]


class Features:
    """The hooks of one run's features, called in order; `Features([])` runs none."""

    def __init__(self, hooks: Sequence[Hooks]):
        self.hooks = list(hooks)

    @property
    def rounds(self) -> int:
        return max([h.rounds for h in self.hooks], default=1)

    def sampler(self, sampler: Any) -> Any:
        for h in self.hooks:
            sampler = h.sampler(sampler)
        return sampler

    def envs(self, envs_G_N: list[list[Any]]) -> list[list[Any]]:
        for h in self.hooks:
            envs_G_N = h.envs(envs_G_N)
        return envs_G_N

    def close(self) -> None:
        """Every hook's `close`, the later ones too when one raises (the first error is raised)."""
        errors = []
        for h in self.hooks:
            try:
                h.close()
            except Exception as err:
                errors.append(err)
        if errors:
            raise errors[0]

    def keep(self, group: Any) -> bool:
        return all(h.keep(group) for h in self.hooks)

    def after_grading(self, step: Step) -> dict[str, Any]:
        return _union(h.after_grading(step) for h in self.hooks)

    def extras(self, step: Step, batch: Any) -> BatchExtras:
        out = BatchExtras()
        for h in self.hooks:
            out = out.merge(h.extras(step, batch))
        return out

    def after_step(self, step: Step, row: dict[str, Any]) -> dict[str, Any]:
        return _union(h.after_step(step, row) for h in self.hooks)


def start(config: Any, run: RunStart) -> Features:
    """The hooks of the features `config` turns on, for the run `run`."""
    return Features([h for f in FEATURES if f.start is not None and (h := f.start(config, run)) is not None])


def _union(rows: typing.Iterable[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in rows:
        out |= row
    return out
