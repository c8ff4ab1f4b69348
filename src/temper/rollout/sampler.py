"""The sampler interface: prompts x n samples -> completions with token ids, per-token logprobs
and stop reasons.

Logprob convention (read this before computing an importance ratio). `Sample.logprobs[t]` is

    log softmax(logits_t / temperature)[token_t]

the log-probability of the chosen token under the temperature-scaled model distribution *before*
top-p / top-k truncation, i.e. exactly what a teacher-forced forward of the same model gives with
`log_softmax(logits / temperature)` gathered at the completion tokens. PPO/GRPO ratios
pi_theta / pi_old must be computed with the same temperature on both sides. At temperature 0
(greedy) the logprobs are those of temperature 1.

Seeds: sample j of prompt i depends only on (seeds[i], j, the prompt, the model), not on the
other prompts of the call, their order or how a backend batches them (up to the rounding of
batched matmuls), so a prompt can move between calls or processes and keep its samples.

Three backends implement `Sampler`: `temper.rollout.hf_sampler.HFSampler` (any transformers causal
LM, in process, CPU or CUDA), `temper.rollout.vllm_sampler.VLLMSampler` (a vLLM engine in process,
optional) and `temper.rollout.vllm_server.VLLMServerSampler` (a vLLM server on 127.0.0.1, optional).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from transformers import PreTrainedTokenizerBase


SampleStopReason = Literal["eos", "stop", "length"]


@dataclass
class Sample:
    """One completion of one prompt.

    token_ids: the generated ids, including the stop token (eos) or the tokens that completed a
        stop string; no padding.
    logprobs: one per token id: log softmax(logits / temperature) of that token before top-p/top-k
        truncation (temperature 1 when sampling greedily). See the module docstring.
    text: the decoded completion without the eos token, cut before the first stop string.
    stop_reason: "eos" (a stop id), "stop" (a stop string) or "length" (max_new_tokens reached).
    policy_version: the weights version that sampled it, where an async rollout worker that swaps
        weights between an episode's turns tags it (`temper.train.pipeline`); None otherwise.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    stop_reason: SampleStopReason
    policy_version: int | None = None


class Sampler(Protocol):
    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] = (),
        seed: int | Sequence[int] = 0,
    ) -> list[list[Sample]]:
        """result[i][j] is sample j of prompt i.

        seed: one int per prompt, or one int from which each prompt's seed is derived
        (`prompt_seeds`). Sample j of prompt i depends only on (its seed, j, the prompt, the
        model), not on the other prompts in the call."""
        ...

    def sync(self, model: torch.nn.Module) -> None:
        """Make the sampler use `model`'s current weights (call after each optimizer update)."""
        ...


# What a sampler may offer besides `Sampler`, checked with `isinstance` where it is used (a wrapper
# that delegates with `__getattr__` declares these itself: on Python 3.12+ `isinstance` does not
# look through `__getattr__`).


@runtime_checkable
class HoldsModel(Protocol):
    """A sampler that runs a model in this process, which temper may read (its token probabilities
    for a `choice` judge, its generation config's eos ids); None: none to read. Implemented by
    `HFSampler` (and AdaptThink's `ForcedFirstToken`, its backend's); read through `model_of` by
    `sampler_stop_ids` and the judge of `model: policy`."""

    model: Any  # a torch.nn.Module, or None


def model_of(sampler: Any) -> Any:
    """The in-process model a sampler runs; None for one that runs none (a vLLM engine)."""
    return sampler.model if isinstance(sampler, HoldsModel) else None


@runtime_checkable
class StopsAtTokens(Protocol):
    """A sampler configured to stop at token ids besides the model's eos ids (the recipe's
    `model.eos_token`). Implemented by `VLLMSampler` and `VLLMServerSampler`; read by
    `sampler_stop_ids`."""

    stop_token_ids: Sequence[int]


def sampler_stop_ids(sampler: Sampler, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids `sampler` stops at: the tokenizer's eos and its model's generation config
    (HFSampler reads both, `hf_sampler.stop_ids`), plus an engine's configured `stop_token_ids`
    (VLLMSampler)."""
    from temper.models.chat import eos_ids

    ids = eos_ids(model_of(sampler), tokenizer)
    extra = sampler.stop_token_ids if isinstance(sampler, StopsAtTokens) else []
    return ids + [int(i) for i in extra if int(i) not in ids]


def check_sample_args(
    prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int
) -> None:
    """The argument checks every `Sampler` backend shares."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"n and max_new_tokens must be >= 1, got {n}, {max_new_tokens}")
    if temperature < 0.0 or not 0.0 < top_p <= 1.0 or top_k < 0:
        raise ValueError(
            f"need temperature >= 0, 0 < top_p <= 1 and top_k >= 0, got {temperature}, {top_p}, {top_k}"
        )
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")


def derive_seed(*parts: int) -> int:
    """A seed in [0, 2**63) that depends on every part: blake2b of their decimal text, so it is
    the same in every process and Python version (unlike `hash`), and nearby inputs such as
    (s, 0) and (s, 1) give unrelated streams."""
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def prompt_seeds(seed: int | Sequence[int], num_prompts: int) -> list[int]:
    """One seed per prompt: the given sequence, or seeds derived from (seed, i)."""
    if not isinstance(seed, Sequence):  # an int (numpy and torch integers included)
        return [derive_seed(int(seed), i) for i in range(num_prompts)]
    seeds = [int(s) for s in seed]
    if len(seeds) != num_prompts:
        raise ValueError(f"got {len(seeds)} seeds for {num_prompts} prompts: pass one per prompt or one int")
    return seeds


def with_greedy_copies(
    decode: Callable[[int], list[list[Sample]]], n: int, temperature: float
) -> list[list[Sample]]:
    """decode(k) -> k samples of each prompt. Greedy samples of a prompt are all the same, so at
    temperature 0 each prompt is decoded once (decode(1)) and copied n times (separate objects: a
    caller may edit one)."""
    if temperature > 0.0:
        return decode(n)
    return [[copy.deepcopy(r[0]) for _ in range(n)] for r in decode(1)]
