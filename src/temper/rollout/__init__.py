"""Samplers: prompts x samples -> completions."""

from temper.rollout.generate import Completion, StopReason, generate

__all__ = ["Completion", "StopReason", "generate"]
