"""The RL sampler: prompts x n samples -> completions with token ids, per-token logprobs and stop reasons.

Logprob convention (read this before computing an importance ratio). `Sample.logprobs[t]` is

    log softmax(logits_t / temperature)[token_t]

the log-probability of the chosen token under the temperature-scaled model distribution *before*
top-p / top-k truncation, i.e. exactly what a teacher-forced forward of the same model gives with
`log_softmax(logits / temperature)` gathered at the completion tokens. PPO/GRPO ratios
pi_theta / pi_old must be computed with the same temperature on both sides. At temperature 0
(greedy) the logprobs are those of temperature 1.

Two backends share the `Sampler` interface: `HFSampler` below (any transformers causal LM, in
process, CPU or CUDA) and `temper.rollout.vllm_sampler.VLLMSampler` (GPU, optional).

How `HFSampler` departs from `model.generate` (measured in benchmarks/sampler_speed.py):
1. Each distinct prompt is prefilled once and its KV cache copied to its n sample rows; with
   short answers the prefill is a large part of the work (64 prompts x 4 samples: ~1.4x).
2. Rows that stop (eos or a stop string) are dropped from the batch, cache included, so a
   finished sample costs nothing; generation ends when every row has stopped. For RL answers of
   a few tokens this is the largest saving (shared/research/cpu-performance.md).
3. The KV cache is one buffer per layer allocated up front and written in place (`_SlabCache`),
   not a `DynamicCache` grown by `torch.cat` every step, and the 4D attention mask is kept in a
   buffer and handed to the model ready, so transformers does not rebuild it every step.
4. Sampling inverts the CDF with one uniform number per row instead of `torch.multinomial`.

Seeds: sample j of prompt i is drawn with uniform numbers from its own stream, seeded by
(seeds[i], j) and drawn before decoding, so it does not depend on the other prompts of the call,
their order, `max_batch_rows` or which rows have finished (up to the rounding of batched matmuls).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache, CacheLayerMixin

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
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    stop_reason: SampleStopReason


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


# ---------------------------------------------------------------------------------------------
# The token choice: a pure function of the logits.


def choose_tokens(
    logits_B_V: torch.Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    uniform_B: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row -> (token_B, logprob_B).

    uniform_B: the uniform number in [0, 1) each row's draw uses; None draws them from `generator`.

    logprob_B = log softmax(logits / T)[token], before truncation (T = 1 when greedy). Sampling
    draws from softmax(logits / T) restricted to the top_k largest logits (0 = all), then to the
    smallest set whose probability reaches top_p (the nucleus, Holtzman et al. 2020), renormalized;
    the order matches transformers and vLLM (temperature, top-k, top-p).
    """
    logits_B_V = logits_B_V.float()
    if temperature == 0.0:
        logp_B_V = torch.log_softmax(logits_B_V, dim=-1)
        token_B = logp_B_V.argmax(dim=-1)
    else:
        logp_B_V = torch.log_softmax(logits_B_V / temperature, dim=-1)
        if top_k <= 0 and top_p >= 1.0:
            probs_B_V = logp_B_V.exp()
        else:
            probs_B_V = torch.softmax(_truncate(logp_B_V, top_p, top_k), dim=-1)
        if uniform_B is None:
            uniform_B = torch.rand(
                probs_B_V.shape[0], generator=generator, device=probs_B_V.device, dtype=probs_B_V.dtype
            )
        token_B = _draw(probs_B_V, uniform_B)
    return token_B, logp_B_V.gather(-1, token_B[:, None]).squeeze(-1)


def _draw(probs_B_V: torch.Tensor, uniform_B: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverting the CDF at the row's uniform number: the distribution of
    `torch.multinomial(probs, 1)`, whose exponential noise over the whole vocabulary cost ~4% of a
    CPU decode step. A zero-probability token is never drawn (its CDF step is empty); if rounding
    puts u * total at the very top of the CDF, the row takes its most likely token."""
    cdf_B_V = probs_B_V.cumsum(dim=-1)
    u_B_1 = uniform_B.to(cdf_B_V.dtype)[:, None]
    token_B_1 = torch.searchsorted(cdf_B_V, u_B_1 * cdf_B_V[:, -1:], right=True)
    overflow_B_1 = token_B_1 >= probs_B_V.shape[-1]
    token_B_1 = torch.where(overflow_B_1, probs_B_V.argmax(dim=-1, keepdim=True), token_B_1)
    return token_B_1.squeeze(-1)


def _truncate(logp_B_V: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Set the log-probs outside the top-k / top-p set to -inf (at least one token survives)."""
    if 0 < top_k < logp_B_V.shape[-1]:
        kth_B_1 = logp_B_V.topk(top_k, dim=-1).values[:, -1:]
        logp_B_V = logp_B_V.masked_fill(logp_B_V < kth_B_1, float("-inf"))
    if top_p < 1.0:
        sorted_B_V, order_B_V = logp_B_V.sort(dim=-1, descending=True)
        probs_B_V = torch.softmax(sorted_B_V, dim=-1)
        mass_before_B_V = probs_B_V.cumsum(dim=-1) - probs_B_V  # mass of the better tokens
        drop_B_V = mass_before_B_V >= top_p
        drop_B_V[:, 0] = False
        logp_B_V = logp_B_V.masked_fill(drop_B_V.scatter(-1, order_B_V, drop_B_V), float("-inf"))
    return logp_B_V


# ---------------------------------------------------------------------------------------------
# A KV cache allocated once per generation and written in place.


class _SlabLayer(CacheLayerMixin):
    """One layer's keys/values in a (rows, heads, capacity, head_dim) buffer.

    `update` writes the new positions in place and returns a view of the filled prefix, so the
    attention never reads the unused tail (unlike transformers' StaticCache, which always attends
    over `max_cache_len` positions and relies on the mask)."""

    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.rows = 0
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, k_dim = key_states.shape
        self.keys = key_states.new_empty((rows, heads, self.capacity, k_dim))
        self.values = value_states.new_empty((rows, heads, self.capacity, value_states.shape[-1]))
        self.rows = rows
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.keys[: self.rows, :, self.length : end] = key_states
        self.values[: self.rows, :, self.length : end] = value_states
        self.length = end
        return self.keys[: self.rows, :, :end], self.values[: self.rows, :, :end]

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows `index` (in that order, repeats allowed) of the filled prefix."""
        if not self.is_initialized:
            return
        n, end = len(index), self.length
        if n > self.keys.shape[0]:  # growing (prefill -> samples): a new, larger buffer
            keys = self.keys.new_empty((n, *self.keys.shape[1:]))
            values = self.values.new_empty((n, *self.values.shape[1:]))
        else:  # shrinking (finished rows dropped): reuse the buffer
            keys, values = self.keys, self.values
        # the right side is gathered into a new tensor before the copy, so in-place is safe
        keys[:n, :, :end] = self.keys[index, :, :end]
        values[:n, :, :end] = self.values[index, :, :end]
        self.keys, self.values, self.rows = keys, values, n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity


class _SlabCache(Cache):
    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[_SlabLayer(capacity) for _ in range(num_layers)])

    def select_rows(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select_rows(index)


class _Mask:
    """Which cache positions each row may attend to, kept in a (rows, capacity) buffer.

    For sdpa and eager attention the model receives a ready 4D mask (a view of this buffer, no
    per-step rebuild); other attention implementations (flash-attention) get the 2D padding mask
    and build their own."""

    def __init__(self, valid_B_C: torch.Tensor, attn_implementation: str, dtype: torch.dtype):
        self.valid_B_C = valid_B_C  # bool
        self.kind = attn_implementation if attn_implementation in ("sdpa", "eager") else "2d"
        self.dtype = dtype

    def select_rows(self, index: torch.Tensor) -> None:
        self.valid_B_C = self.valid_B_C[index]

    def decode(self, length: int) -> torch.Tensor:
        """The mask for one new query token when the cache holds `length` positions (itself included)."""
        valid_B_L = self.valid_B_C[:, :length]
        if self.kind == "sdpa":
            return valid_B_L[:, None, None, :]
        if self.kind == "eager":
            return self._additive(valid_B_L[:, None, None, :])
        return valid_B_L.long()

    def prefill(self, width: int) -> torch.Tensor:
        """Causal + key padding over the left-padded prompts; a padding query sees itself, so no
        softmax row is empty (an all-masked row gives NaN keys/values in the cache)."""
        valid_B_P = self.valid_B_C[:, :width]
        if self.kind == "2d":
            return valid_B_P.long()
        causal_P_P = torch.ones(width, width, dtype=torch.bool, device=valid_B_P.device).tril()
        eye_P_P = torch.eye(width, dtype=torch.bool, device=valid_B_P.device)
        mask_B_1_P_P = (causal_P_P & valid_B_P[:, None, :]) | eye_P_P
        mask_B_1_P_P = mask_B_1_P_P[:, None]
        return mask_B_1_P_P if self.kind == "sdpa" else self._additive(mask_B_1_P_P)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(self.dtype).min)


def _check_attention_layers(config, capacity: int) -> None:
    """The slab cache and the ready 4D mask assume full causal attention in every layer. Sliding
    windows give the same result while sequences fit in the window; anything else is refused."""
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not types <= {"full_attention", "sliding_attention"}:
        raise NotImplementedError(f"HFSampler supports attention layers only, this model has {sorted(types)}")
    window = getattr(config, "sliding_window", None)
    sliding = "sliding_attention" in types or getattr(config, "layer_types", None) is None
    if sliding and window is not None and capacity > window:
        raise NotImplementedError(
            f"prompt + max_new_tokens = {capacity} exceeds the sliding window ({window}); HFSampler "
            "implements full attention only"
        )


# ---------------------------------------------------------------------------------------------


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


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class HFSampler:
    """`Sampler` over an in-process transformers causal LM (shares the module with the trainer).

    max_batch_rows: most sequences (prompt x sample) decoded together; prompts are chunked so
        that a chunk's rows stay under it.
    share_prefill: prefill each distinct prompt once and copy its cache to its samples. False
        prefills every row on its own (the reference path the tests compare against).
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
    ):
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.share_prefill = share_prefill

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

        greedy = temperature == 0.0
        rows_per_prompt = 1 if greedy else n  # greedy samples are identical: decode once
        # longest prompts first so a chunk holds similar lengths (less padding); stable, so a
        # prompt's samples stay in order. A job is (prompt i, sample j).
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        jobs = [(i, j) for i in order for j in range(rows_per_prompt)]
        results: list[list[Sample]] = [[] for _ in prompts]

        model = self.model
        eos = stop_ids(model, self.tokenizer)
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(jobs), self.max_batch_rows):
                    chunk = jobs[start : start + self.max_batch_rows]
                    outs = self._generate_chunk(
                        [prompts[i] for i, _ in chunk],
                        [derive_seed(seeds[i], j) for i, j in chunk],
                        eos=eos,
                        stop=stop,
                        max_new_tokens=max_new_tokens,
                        temperature=temperature,
                        top_p=top_p,
                        top_k=top_k,
                    )
                    for (i, _), (token_ids, logprobs, reason) in zip(chunk, outs, strict=True):
                        results[i].append(self._to_sample(prompts[i], token_ids, logprobs, reason, stop))
        finally:
            model.train(was_training)
        if greedy:
            results = [[copy.deepcopy(r[0]) for _ in range(n)] for r in results]
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
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
    ) -> list[tuple[list[int], list[float], SampleStopReason]]:
        """Decode one batch of rows; row r continues row_prompts[r] with uniforms seeded by row_seeds[r]."""
        model, device = self.model, _model_device(self.model)
        # distinct prompts, and which one each row continues
        if self.share_prefill:
            index_of: dict[tuple[int, ...], int] = {}
            src = [index_of.setdefault(tuple(p), len(index_of)) for p in row_prompts]
            unique = [list(p) for p in index_of]
        else:
            src, unique = list(range(len(row_prompts))), row_prompts
        rows, width = len(row_prompts), max(len(p) for p in unique)
        capacity = width + max_new_tokens

        # left-padded prompts; positions count real tokens only (as model.generate does)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        ids_U_P = torch.full((len(unique), width), pad_id, dtype=torch.long)
        valid_U_C = torch.zeros((len(unique), capacity), dtype=torch.bool)
        for u, p in enumerate(unique):
            ids_U_P[u, width - len(p) :] = torch.tensor(p)
            valid_U_C[u, width - len(p) : width] = True
        ids_U_P, valid_U_C = ids_U_P.to(device), valid_U_C.to(device)
        pos_U_P = (valid_U_C[:, :width].long().cumsum(-1) - 1).clamp(min=0)

        config = model.config.get_text_config(decoder=True)
        _check_attention_layers(config, capacity)
        mask = _Mask(valid_U_C, model.config._attn_implementation, next(model.parameters()).dtype)
        cache = _SlabCache(config.num_hidden_layers, capacity)
        out = model(
            input_ids=ids_U_P,
            attention_mask=mask.prefill(width),
            position_ids=pos_U_P,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        # copy each prompt's cache to its rows
        src_R = torch.tensor(src, device=device)
        if len(unique) != rows or src != list(range(rows)):
            cache.select_rows(src_R)
            mask.select_rows(src_R)
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
        uniform_A_T = _row_uniforms(row_seeds, max_new_tokens, device) if temperature > 0.0 else None

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
                cache.select_rows(keep_A)
                mask.select_rows(keep_A)
                row_A, token_A, next_pos_A = row_A[keep_A], token_A[keep_A], next_pos_A[keep_A]
                if uniform_A_T is not None:
                    uniform_A_T = uniform_A_T[keep_A]
                done_A = done_A[keep_A]
            length = cache.get_seq_length() + 1
            mask.valid_B_C[:, length - 1] = True
            out = model(
                input_ids=token_A[:, None],
                attention_mask=mask.decode(length),
                position_ids=next_pos_A[:, None],
                cache=cache,
                use_cache=True,
            )
            logits_A_V = out.logits[:, -1]
            next_pos_A = next_pos_A + 1

        tokens, logps = tokens_R_T.tolist(), logps_R_T.tolist()
        return [(tokens[r][: lengths[r]], logps[r][: lengths[r]], reasons[r]) for r in range(rows)]


def _row_uniforms(row_seeds: list[int], steps: int, device: torch.device) -> torch.Tensor:
    """(rows, steps) uniform numbers in [0, 1), row r from a generator seeded with row_seeds[r]."""
    gen = torch.Generator()
    out_R_T = torch.empty((len(row_seeds), steps), dtype=torch.float32)
    for r, s in enumerate(row_seeds):
        torch.rand(steps, generator=gen.manual_seed(s), out=out_R_T[r])
    return out_R_T.to(device)


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
