"""DAPO dynamic sampling (Yu et al. 2025 §3.2) as an RL feature, `dynamic_sampling: {max_rounds}`:
groups whose rewards are all equal (no learning signal) are dropped, and each process draws more
prompts for its share until it is full or `max_rounds` sampling rounds are spent
(`temper.train.collect.sample_share`); `kept_groups` is logged.

The block replaced the flat keys `dynamic_sampling: true` and `max_sampling_rounds`; the stage
hash covers it in that form (`hashed`), so runs recorded before stay complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from temper.train.features.base import Error, Hooks, RLFeature, Step

OLD_ROUNDS = 4
"""The default of the flat `max_sampling_rounds` the block replaced (its hashed form without a block)."""


@dataclass
class DynamicSampling:
    """Refill the step's batch with groups that have a learning signal."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    max_rounds: Annotated[int, Field(ge=1)] = 4
    """Sampling rounds a step may take (the first one included)."""


class Refill(Hooks):
    """Keep the groups whose rewards differ, for up to `rounds` sampling rounds."""

    def __init__(self, rounds: int):
        self.rounds = rounds

    def keep(self, group: Any) -> bool:
        return group.cause is None

    def after_grading(self, step: Step) -> dict[str, Any]:
        return {"kept_groups": len(step.groups)}


def hashed(config: Any) -> dict[str, Any]:
    block = config.dynamic_sampling
    return {
        "dynamic_sampling": block is not None,
        "max_sampling_rounds": block.max_rounds if block else OLD_ROUNDS,
    }


def moved(train: dict[str, Any]) -> list[Error]:
    out: list[Error] = []
    if "max_sampling_rounds" in train:
        out.append(
            (
                ("train", "max_sampling_rounds"),
                "moved into the dynamic_sampling block: dynamic_sampling: {max_rounds: N}",
            )
        )
    if isinstance(train.get("dynamic_sampling"), bool):
        out.append(
            (
                ("train", "dynamic_sampling"),
                "is a block: dynamic_sampling: {max_rounds: 4} (refills for at most 4 sampling rounds); "
                "leave it out for none",
            )
        )
    return out


FEATURE = RLFeature(
    name="dynamic_sampling",
    block=DynamicSampling | None,
    doc="DAPO dynamic sampling: drop the groups whose rewards are all equal and draw more prompts, "
    "for up to max_rounds sampling rounds a step, e.g. {max_rounds: 4}. null: every group is trained on.",
    order=5,
    hashed=hashed,
    moved=moved,
    start=lambda config, run: Refill(config.dynamic_sampling.max_rounds) if config.dynamic_sampling else None,
)
