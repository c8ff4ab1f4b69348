"""A KV cache allocated once per generation and written in place, and the attention mask beside it
(used by `HFSampler`)."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlabLayer(CacheLayerMixin):
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


class SlabCache(Cache):
    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[SlabLayer(capacity) for _ in range(num_layers)])

    def select_rows(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select_rows(index)


class AttentionMask:
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


def check_attention_layers(config, capacity: int) -> None:
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
