"""Samplers: prompts x samples -> completions (token ids, per-token logprobs, stop reasons).

`sampler` is the interface both backends implement; `hf_sampler` the in-process transformers
backend (with `sampling`, the token choice, and `kv_cache`); `vllm_sampler` the optional vLLM one,
imported only where it is asked for. `loop` runs episodes of environments in lockstep over a
sampler and `trajectory` records each as token-exact segments (they import the environments, so
this package's `__init__` does not import them).
"""

from temper.rollout.hf_sampler import HFSampler, stop_ids
from temper.rollout.sampler import Sample, Sampler, SampleStopReason, prompt_seeds

__all__ = ["HFSampler", "Sample", "SampleStopReason", "Sampler", "prompt_seeds", "stop_ids"]
