"""The `Sampler` interface over a vLLM engine (CUDA machines; vLLM is an optional dependency).

Differences from `HFSampler` a caller may notice:
1. Logprobs come from vLLM with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2): the
   log-probability under logits / temperature, as in `HFSampler`, as long as top_p == 1 and
   top_k == 0. With top-p/top-k vLLM reports the log-probability under the *truncated,
   renormalized* distribution, which a teacher-forced forward does not reproduce; `sample` warns.
2. Seeds: prompt i is one request with `SamplingParams(n=n, seed=seeds[i])` (`prompt_seeds`);
   vLLM gives its j-th child seeds[i] + j (vllm/v1/engine/parallel_sampling.py), so a prompt's
   samples do not depend on the other prompts of the call. Same seeds, same engine -> same
   samples, but not the same samples as `HFSampler`.
3. `sync(model)` pushes the trainer's weights into the engine (see `sync`); call it after every
   optimizer update, or vLLM keeps sampling from the old policy.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from temper.rollout.sampler import (
    Sample,
    SampleStopReason,
    check_sample_args,
    prompt_seeds,
    with_greedy_copies,
)


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker: `collective_rpc` passes the worker as the first argument."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=weights)


def _named_weights(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """Checkpoint-style (name, tensor) pairs, the names `from_pretrained` files use."""
    for name, tensor in model.state_dict().items():
        yield name, tensor.detach()


class VLLMSampler:
    """`Sampler` backed by `vllm.LLM`.

    model: a model directory or hub id vLLM can load (e.g. what `temper.models.save_model` wrote).
    stop_token_ids: ids to stop at besides the model's own eos ids (the recipe's `model.eos_token`).
    llm_kwargs: passed to `vllm.LLM` (gpu_memory_utilization, max_model_len, dtype, ...).
    For cheap weight syncs run vLLM in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the
    weights then reach the engine without crossing a process boundary.
    """

    def __init__(self, model: str | os.PathLike, stop_token_ids: Sequence[int] = (), **llm_kwargs: Any):
        try:
            import vllm
        except ImportError as err:
            raise ImportError(
                "VLLMSampler needs vLLM (`pip install vllm`, CUDA only); on a CPU use "
                "temper.rollout.HFSampler, which has the same interface"
            ) from err
        self._vllm = vllm
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        try:
            self.llm = vllm.LLM(model=str(model), **llm_kwargs)
        except TypeError as err:
            if "logprobs_mode" in str(err):
                raise RuntimeError(
                    f"this vLLM ({getattr(vllm, '__version__', '?')}) has no `logprobs_mode`; temper needs "
                    "vLLM >= 0.10.2 so that sampled logprobs include the temperature"
                ) from err
            raise
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = self._config_stop_ids(str(model))
        self.stop_token_ids += [int(i) for i in stop_token_ids if int(i) not in self.stop_token_ids]

    def _config_stop_ids(self, model: str) -> list[int]:
        """The generation config's eos ids (vLLM stops on the tokenizer's eos by itself)."""
        from transformers import GenerationConfig

        try:
            eos = GenerationConfig.from_pretrained(model).eos_token_id
        except (OSError, ValueError):
            return []
        return [int(i) for i in ([eos] if isinstance(eos, int) else eos or [])]

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
        check_sample_args(prompts, n, max_new_tokens, temperature, top_p, top_k)
        seeds = prompt_seeds(seed, len(prompts))
        if not prompts:
            return []
        if temperature > 0.0 and (top_p < 1.0 or top_k > 0):
            warnings.warn(
                "VLLMSampler with top_p/top_k: vLLM's logprobs are those of the truncated distribution, "
                "not log softmax(logits / temperature) as HFSampler returns",
                stacklevel=2,
            )
        return with_greedy_copies(
            lambda k: self._generate(prompts, k, seeds, max_new_tokens, temperature, top_p, top_k, stop),
            n,
            temperature,
        )

    def _generate(
        self,
        prompts: list[list[int]],
        n: int,
        seeds: list[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        stop: Sequence[str],
    ) -> list[list[Sample]]:
        params = [
            self._vllm.SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k if top_k > 0 else -1,  # -1 disables top-k in every vLLM version
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=max_new_tokens,
                stop=list(stop) or None,
                stop_token_ids=self.stop_token_ids or None,
                seed=seed,
                logprobs=0,  # the sampled token's logprob only
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling_params=params, use_tqdm=False
        )
        return [
            [_to_sample(prompt, c) for c in sorted(request.outputs, key=lambda c: c.index)]
            for prompt, request in zip(prompts, outputs, strict=True)
        ]

    def sync(self, model: torch.nn.Module) -> None:
        """Load `model`'s current weights into the engine, then drop vLLM's prefix cache (its
        keys/values were computed with the old weights).

        Tries, in order: `LLM.collective_rpc` with a function run on each worker (documented
        since vLLM 0.8; in-process the tensors are passed as they are, across processes vLLM
        serializes them), and the in-process `llm_engine.model_executor.driver_worker` path
        TRL's colocate mode uses.
        A PEFT model has its adapter merged for the copy and unmerged afterwards."""
        weights = self._weights(model)
        errors = []
        if hasattr(self.llm, "collective_rpc"):
            try:
                self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
            except Exception as err:  # version-dependent internals: collected and reported below
                errors.append(f"collective_rpc: {type(err).__name__}: {err}")
            else:
                self.llm.reset_prefix_cache()
                return
        try:
            worker = self.llm.llm_engine.model_executor.driver_worker
            _load_weights_on_worker(worker, weights)
        except AttributeError as err:
            errors.append(f"llm_engine.model_executor.driver_worker: {err}")
        else:
            self.llm.reset_prefix_cache()
            return
        raise RuntimeError(
            "could not load weights into this vLLM engine "
            f"({getattr(self._vllm, '__version__', '?')}); tried: " + "; ".join(errors)
        )

    @staticmethod
    def _weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        if not hasattr(model, "merge_adapter"):
            return list(_named_weights(model))
        # PEFT: fold the adapter into the base weights and use the base model's names
        # (`base_model.model.x.base_layer.weight` -> `x.weight`), as TRL does
        model.merge_adapter()
        try:
            out = []
            for name, tensor in _named_weights(model):
                if "lora_" in name or "original_module" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                out.append((name.replace("modules_to_save.default.", ""), tensor.clone()))
            return out
        finally:
            model.unmerge_adapter()


def _to_sample(prompt: list[int], completion: Any) -> Sample:
    """A vLLM `CompletionOutput` -> `Sample`. finish_reason is "stop" for an eos id and for a
    stop string; `stop_reason` tells them apart (the string, an int id, or None for eos)."""
    token_ids = list(completion.token_ids)
    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs, strict=True)]
    reason: SampleStopReason
    if completion.finish_reason == "length":
        reason = "length"
    elif isinstance(completion.stop_reason, str):
        reason = "stop"
    else:
        reason = "eos"
    return Sample(list(prompt), token_ids, logprobs, completion.text, reason)
