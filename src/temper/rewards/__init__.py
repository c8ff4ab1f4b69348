"""Reward components and their weighted composition; every component is logged on its own."""

from temper.rewards.components import COMPONENTS, RewardInput, combine

__all__ = ["COMPONENTS", "RewardInput", "combine"]
