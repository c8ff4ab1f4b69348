"""Samplers: prompts x samples -> completions (token ids, per-token logprobs, stop reasons)."""

from temper.rollout.sampler import HFSampler, Sample, Sampler

__all__ = ["HFSampler", "Sample", "Sampler"]
