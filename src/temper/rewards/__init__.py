"""Reward components and their weighted composition; every component is logged on its own."""

from temper.rewards.components import BATCH_COMPONENTS, COMPONENTS, RewardInput, combine

__all__ = ["BATCH_COMPONENTS", "COMPONENTS", "RewardInput", "combine"]
