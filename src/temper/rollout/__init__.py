"""Samplers: prompts x samples -> completions (token ids, per-token logprobs, stop reasons).

`sampler` is the interface the backends implement; `hf_sampler` the in-process transformers
backend (with `sampling`, the token choice, and `kv_cache`); `vllm_sampler` the optional in-process
vLLM one and `vllm_server` a vLLM server's (with `server_process`, its lifecycle), which share
`vllm_shared`, each imported only where it is asked for. `loop` runs episodes of environments in lockstep over a
sampler and `trajectory` records each as token-exact segments (they import the environments, so
this package's `__init__` does not import them).
"""

from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
    from temper.rollout.hf_sampler import HFSampler, stop_ids
    from temper.rollout.sampler import Sample, Sampler, SampleStopReason, prompt_seeds

__getattr__, __dir__ = exports(
    globals(),
    {
        "HFSampler": "hf_sampler",
        "stop_ids": "hf_sampler",
        "Sample": "sampler",
        "Sampler": "sampler",
        "SampleStopReason": "sampler",
        "prompt_seeds": "sampler",
    },
)

__all__ = ["HFSampler", "Sample", "SampleStopReason", "Sampler", "prompt_seeds", "stop_ids"]
