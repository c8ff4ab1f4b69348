"""What the two vLLM samplers share: the in-process `VLLMSampler` (vllm_sampler.py) and the served
`VLLMServerSampler` (vllm_server.py). Neither imports vLLM here: the served sampler's process may
not have it.

- the errors (`EngineError`, `SyncError`) and the refusal of an engine that died or failed a sync;
- the split of a call into calls whose prefills fit one scheduler step (`fitting_calls`): a seeded
  request whose prefill vLLM chunks kills the CPU engine ("CPU Generator does not use offset",
  then EngineDeadError, vLLM 0.32), and temper seeds every request;
- the trainer's weights as checkpoint-format tensors (`trainer_weights`, a LoRA merged);
- the post-sync check (`check_engine`): the engine's logprobs on fixed sequences against a
  teacher-forced forward of the trainer's model;
- vLLM's stop reasons as temper's, the generation config's eos ids, the top-p/top-k warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from temper.rollout.sampler import Sample, SampleStopReason

if TYPE_CHECKING:
    import torch

# On a CPU: a 1 GiB KV cache and no thread pinning (the default pins the worker to one core and
# reserves another).
CPU_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# A budget well above the 4,096 default, so that few calls need splitting (`fitting_calls`).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
# The token sequences of the post-sync check: fixed, so that two syncs compare like with like.
CHECK_PROMPTS = 2
CHECK_PROMPT_LEN = 136  # past one KV block (128 tokens on vLLM 0.32's CPU): the prefix cache keeps it
CHECK_NEW_TOKENS = 8
CHECK_SEED = 1234


class EngineError(RuntimeError):
    """The engine cannot be used: it died (vLLM then hangs on every later call, so temper refuses
    them), or a weight sync failed (`SyncError`)."""


class SyncError(EngineError):
    """The engine could not take the trainer's weights, or took them and samples from something
    else (the post-sync check): sampling on would train on another policy's samples."""


def refuse_if_broken(broken: str | None, error: type[EngineError]) -> None:
    """Raise `error` when the engine was marked unusable (`broken`: why)."""
    if broken is not None:
        cause = "a failed weight sync" if error is SyncError else "its death"
        raise error(f"this vLLM engine is unusable since {cause}: {broken}")


def check_sync_default(check_sync: float | None) -> float | None:
    """`check_sync`, or $TEMPER_VLLM_CHECK_SYNC where it is None."""
    if check_sync is None and os.environ.get("TEMPER_VLLM_CHECK_SYNC"):
        return float(os.environ["TEMPER_VLLM_CHECK_SYNC"])
    return check_sync


def warn_if_truncated(temperature: float, top_p: float, top_k: int) -> None:
    if temperature > 0.0 and (top_p < 1.0 or top_k > 0):
        warnings.warn(
            "vLLM with top_p/top_k: its logprobs are those of the truncated distribution, "
            "not log softmax(logits / temperature) as HFSampler returns",
            stacklevel=3,
        )


def fitting_calls(prompts: list[list[int]], n: int, token_budget: int, max_num_seqs: int) -> list[range]:
    """Consecutive slices of `prompts` whose prefills (n per prompt: vLLM prefills each child of
    a request) fit the scheduler's token budget together with one decode token per running
    sequence. Every prefill of such a call is scheduled whole, whenever it is admitted, so none
    is chunked. A prompt too long for the budget on its own is refused."""
    budget = token_budget - max_num_seqs
    calls, start, used = [], 0, 0
    for i, prompt in enumerate(prompts):
        need = len(prompt) * n
        if need > budget:
            raise ValueError(
                f"prompt {i} has {len(prompt)} tokens x {n} samples, more than the engine prefills in "
                f"one step ({token_budget} max_num_batched_tokens - {max_num_seqs} "
                "max_num_seqs): raise max_num_batched_tokens"
            )
        if used + need > budget:
            calls.append(range(start, i))
            start, used = i, 0
        used += need
    calls.append(range(start, len(prompts)))
    return calls


def stop_reason_of(finish_reason: str | None, stop_reason: int | str | None) -> SampleStopReason:
    """vLLM's finish_reason is "stop" for an eos id and for a stop string; `stop_reason` tells them
    apart (the string, an int id, or None for eos)."""
    if finish_reason == "length":
        return "length"
    return "stop" if isinstance(stop_reason, str) else "eos"


def config_stop_ids(model: str) -> list[int]:
    """The generation config's eos ids of a model folder or hub id (vLLM stops on the tokenizer's
    eos by itself); [] where there is none to read."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model).eos_token_id
    except (OSError, ValueError):
        return []
    return [int(i) for i in ([eos] if isinstance(eos, int) else eos or [])]


def _named_weights(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """Checkpoint-style (name, tensor) pairs, the names `from_pretrained` files use."""
    for name, tensor in model.state_dict().items():
        yield name, tensor.detach()


def trainer_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """All of `model`'s weights under checkpoint names. A PEFT model has its adapter folded into
    the base weights and the base model's names (`base_model.model.x.base_layer.weight` ->
    `x.weight`), as TRL does, and is unmerged afterwards (vLLM receives whole weights)."""
    if not hasattr(model, "merge_adapter"):
        return list(_named_weights(model))
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


# (prompts, seeds) -> one sample per prompt at temperature 1, CHECK_NEW_TOKENS tokens each
CheckGenerate = Callable[[list[list[int]], list[int]], list[Sample]]


def engine_mismatch(model: torch.nn.Module, generate: CheckGenerate, max_model_len: int) -> float:
    """Sample a few fixed prompts on the engine at temperature 1 and return the largest |difference|
    between a sampled token's logprob and a teacher-forced forward of `model`: a sync that left the
    engine on old weights (or on wrongly mapped ones) shows as a difference far above rounding. The
    prompts are the same at every check and longer than a KV block, so the previous check's
    cached keys/values are there to be reused if the prefix cache was not reset."""
    import torch

    vocab = int(model.get_output_embeddings().weight.shape[0])
    gen = torch.Generator().manual_seed(CHECK_SEED)
    length = max(1, min(CHECK_PROMPT_LEN, max_model_len - CHECK_NEW_TOKENS))
    prompts = torch.randint(0, vocab, (CHECK_PROMPTS, length), generator=gen).tolist()
    samples = generate(prompts, [CHECK_SEED + i for i in range(CHECK_PROMPTS)])
    worst = 0.0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for s in samples:
                ids = torch.tensor([s.prompt_ids + s.token_ids], device=device)
                logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
                expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(s.prompt_ids) :, None])[:, 0]
                got = torch.tensor(s.logprobs, device=device)
                worst = max(worst, float((got - expected.to(got.dtype)).abs().max()))
    finally:
        model.train(was_training)
    return worst


def raise_if_mismatched(worst: float, tolerance: float) -> None:
    """`SyncError` when the post-sync check's difference `worst` is past `tolerance`."""
    if worst > tolerance:
        raise SyncError(
            f"after the weight sync the vLLM engine's logprobs differ from the trainer's by up to "
            f"{worst:.3g} (check_sync tolerance {tolerance:g}): the engine is not sampling "
            "from the trained weights"
        )
