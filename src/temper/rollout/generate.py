"""Batched generation for evaluation: prompts x samples -> completions.

This wraps `model.generate` (left padding, attention mask, KV cache). A faster sampler with
per-token logprobs will replace the internals; callers depend only on `generate` and `Completion`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

StopReason = Literal["eos", "length"]


@dataclass(frozen=True)
class Completion:
    """One sampled continuation of a prompt.

    token_ids: the generated ids, ending with the stop id when stop_reason == "eos"; no padding.
    text: the decoded ids without the stop id and without special tokens.
    stop_reason: "eos" (a stop id was produced) or "length" (max_new_tokens reached first).
    """

    token_ids: list[int]
    text: str
    stop_reason: StopReason


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos id together with the model's `generation_config.eos_token_id`.

    Chat models often stop on more than one id (Qwen2.5: `<|im_end|>` and `<|endoftext|>`)."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        config_eos = [config_eos]
    for i in config_eos or []:
        if int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an eos id")
    return ids


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad to a common length: (input_ids_B_P, attention_mask_B_P), mask 0 on padding.

    Left padding keeps every prompt's last token in the last column, where generation continues."""
    width = max(len(s) for s in seqs)
    ids_B_P = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask_B_P = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        if s:
            ids_B_P[b, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask_B_P[b, width - len(s) :] = 1
    return ids_B_P, mask_B_P


def generation_config(
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    stop: list[int],
    pad_id: int,
) -> GenerationConfig:
    """Every option that changes the distribution is set, so a hub model's
    `generation_config.json` (e.g. top_k=20, repetition_penalty=1.05) cannot leak into eval:
    transformers fills only the options left unset from the model's config."""
    common = dict(
        max_new_tokens=max_new_tokens,
        eos_token_id=stop,
        pad_token_id=pad_id,
        num_beams=1,
        num_return_sequences=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        use_cache=True,
    )
    if temperature == 0.0:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        min_p=0.0,
        typical_p=1.0,
        **common,
    )


def to_completion(
    new_ids: Sequence[int], stop: Sequence[int], tokenizer: PreTrainedTokenizerBase
) -> Completion:
    """Cut generated ids at the first stop id (padding after it is dropped) and decode."""
    stop_set = set(stop)
    for j, t in enumerate(new_ids):
        if t in stop_set:
            text = tokenizer.decode(list(new_ids[:j]), skip_special_tokens=True)
            return Completion(list(new_ids[: j + 1]), text, "eos")
    text = tokenizer.decode(list(new_ids), skip_special_tokens=True)
    return Completion(list(new_ids), text, "length")


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    num_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    seed: int = 0,
) -> list[list[Completion]]:
    """Complete each prompt `num_samples` times; result[i][j] is sample j of prompt i.

    temperature 0 is greedy (argmax), and its one completion is repeated `num_samples` times.
    Otherwise tokens are drawn from softmax(logits / temperature) restricted to the top-p
    nucleus (Holtzman et al. 2020). `batch_size` counts sequences (prompt x sample) per
    forward pass. Sampling is reproducible for fixed (seed, prompts, batch_size): the global
    torch RNG is forked, seeded with `seed`, and restored afterwards.
    """
    if num_samples < 1 or max_new_tokens < 1 or batch_size < 1:
        raise ValueError("num_samples, max_new_tokens and batch_size must be >= 1")
    if temperature < 0.0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if not prompts:
        return []

    stop = stop_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    config = generation_config(
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        stop=stop,
        pad_id=pad_id,
    )
    greedy = temperature == 0.0
    runs = 1 if greedy else num_samples
    # one job per sequence; sorting by length puts similar prompts in a batch (less padding),
    # and the stable sort keeps each prompt's samples in order
    jobs = sorted((i for i in range(len(prompts)) for _ in range(runs)), key=lambda i: -len(prompts[i]))
    results: list[list[Completion]] = [[] for _ in prompts]
    device = _model_device(model)
    cuda_devices = [device.index or 0] if device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=cuda_devices), torch.inference_mode():
            torch.manual_seed(seed)
            for start in range(0, len(jobs), batch_size):
                batch = jobs[start : start + batch_size]
                ids_B_P, mask_B_P = left_pad([prompts[i] for i in batch], pad_id)
                out_B_L = model.generate(
                    input_ids=ids_B_P.to(device),
                    attention_mask=mask_B_P.to(device),
                    generation_config=config,
                )
                new_B_T = out_B_L[:, ids_B_P.shape[1] :].tolist()
                for i, new_ids in zip(batch, new_B_T, strict=True):
                    results[i].append(to_completion(new_ids, stop, tokenizer))
    finally:
        model.train(was_training)
    if greedy:
        results = [r * num_samples for r in results]
    return results
