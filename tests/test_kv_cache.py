"""rollout/kv_cache.py on exact values: which attention-layer layouts the slab cache accepts (with
the refusals word for word), and the mask each attention kind gets at prefill.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

from types import SimpleNamespace

import pytest
import torch

from temper.rollout.kv_cache import AttentionMask, SlabLayer, check_attention_layers


def _refusal(config, capacity: int) -> str | None:
    try:
        check_attention_layers(config, capacity)
    except NotImplementedError as err:
        return str(err)
    return None


def test_layer_types_other_than_full_or_sliding_attention_are_refused():
    config = SimpleNamespace(layer_types=["full_attention", "mamba", "full_attention"])
    assert _refusal(config, 8) == (
        "HFSampler supports attention layers only, this model has ['full_attention', 'mamba']"
    )
    # full and sliding layers together are accepted (the set is not a proper subset of the two)
    assert _refusal(SimpleNamespace(layer_types=["full_attention", "sliding_attention"]), 8) is None
    assert _refusal(SimpleNamespace(layer_types=["sliding_attention"]), 8) is None
    assert _refusal(SimpleNamespace(layer_types=None), 8) is None


WINDOW_ERROR = (
    "prompt + max_new_tokens = 5 exceeds the sliding window (4); HFSampler implements full attention only"
)


def test_a_sliding_window_shorter_than_prompt_and_answer_is_refused():
    # a config without layer_types (older models: Mistral) uses its window in every layer
    assert _refusal(SimpleNamespace(sliding_window=4), 5) == WINDOW_ERROR
    assert _refusal(SimpleNamespace(layer_types=None, sliding_window=4), 5) == WINDOW_ERROR
    assert _refusal(SimpleNamespace(sliding_window=4), 4) is None  # exactly the window fits
    assert _refusal(SimpleNamespace(sliding_window=None), 5) is None
    assert _refusal(SimpleNamespace(), 5) is None
    # with layer_types, only models that have a sliding layer are concerned
    sliding = SimpleNamespace(layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    assert _refusal(sliding, 5) == WINDOW_ERROR
    assert _refusal(SimpleNamespace(layer_types=["sliding_attention"], sliding_window=4), 5) == WINDOW_ERROR
    full = SimpleNamespace(layer_types=["full_attention", "full_attention"], sliding_window=4)
    assert _refusal(full, 5) is None


VALID = torch.tensor([[False, True, True], [True, True, True]])


def test_prefill_mask_per_attention_kind():
    """sdpa gets a boolean 4D mask, eager an additive one in the model's dtype, anything else (flash
    attention) the 2D padding mask as integers; a padding query sees only itself."""
    sdpa = AttentionMask(VALID, "sdpa", torch.float32).prefill(3)
    assert sdpa.dtype == torch.bool and sdpa.shape == (2, 1, 3, 3)
    assert sdpa[:, 0].tolist() == [
        [[True, False, False], [False, True, False], [False, True, True]],
        [[True, False, False], [True, True, False], [True, True, True]],
    ]
    eager = AttentionMask(VALID, "eager", torch.float32).prefill(3)
    low = torch.finfo(torch.float32).min
    assert eager.dtype == torch.float32
    assert eager[0, 0].tolist() == [[0.0, low, low], [low, 0.0, low], [low, 0.0, 0.0]]
    for kind in ("flash_attention_2", "flex_attention"):
        flat = AttentionMask(VALID, kind, torch.float32)
        assert flat.kind == "2d"
        two_d = flat.prefill(2)
        assert two_d.dtype == torch.long and two_d.tolist() == [[0, 1], [1, 1]]
        assert flat.decode(3).tolist() == [[0, 1, 1], [1, 1, 1]]


def test_the_additive_mask_keeps_the_model_dtype_with_a_float32_zero_default():
    """the zero of allowed positions is made in the mask's dtype: a float32 zero would promote a
    bfloat16 mask to float32."""
    mask = AttentionMask(VALID, "eager", torch.bfloat16)
    assert mask.prefill(3).dtype == torch.bfloat16 and mask.decode(2).dtype == torch.bfloat16


@pytest.mark.parametrize("kind", ["sdpa", "eager"])
def test_row_selection_moves_the_mask_rows(kind):
    mask = AttentionMask(VALID.clone(), kind, torch.float32)
    mask.select_rows(torch.tensor([0, 0, 1]))
    assert mask.valid_B_C.tolist() == [[False, True, True], [False, True, True], [True, True, True]]


# ---- exact cases, folded in from test_rollout_exact.py -----------------------------------------
# The rollout package's pure parts on hand-computed values: which tokens top-p and top-k keep (a
# distribution of halves and quarters, and the uniform number that picks between them), the stop ids
# a sampler stops at, the attention masks per attention kind and dtype, and the slab cache's sizes.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


def test_attention_masks_per_kind():
    valid = torch.tensor([[False, True, True, False], [True, True, True, True]])
    sdpa = AttentionMask(valid, "sdpa", torch.bfloat16).decode(3)
    assert sdpa.dtype == torch.bool and sdpa.shape == (2, 1, 1, 3)
    assert sdpa[:, 0, 0].tolist() == [[False, True, True], [True, True, True]]
    eager = AttentionMask(valid, "eager", torch.bfloat16).decode(3)
    low = torch.finfo(torch.bfloat16).min
    assert eager.dtype == torch.bfloat16 and eager.shape == (2, 1, 1, 3)
    assert eager[:, 0, 0].tolist() == [[low, 0.0, 0.0], [0.0, 0.0, 0.0]]
    flash = AttentionMask(valid, "flash_attention_2", torch.bfloat16).decode(3)
    assert flash.dtype == torch.long and flash.tolist() == [[0, 1, 1], [1, 1, 1]]
    prefill = AttentionMask(valid, "eager", torch.float16).prefill(2)
    assert prefill.dtype == torch.float16
    lo = torch.finfo(torch.float16).min
    # row 0: position 0 is padding (sees only itself), position 1 sees itself; row 1: causal
    assert prefill[:, 0].tolist() == [[[0.0, lo], [lo, 0.0]], [[0.0, lo], [0.0, 0.0]]]


def test_slab_layer_sizes_and_row_selection():
    layer = SlabLayer(capacity=8)
    k = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    layer.update(k, -k)
    assert layer.get_mask_sizes(1) == (4, 0) and layer.get_seq_length() == 3 and layer.get_max_length() == 8
    layer.select_rows(torch.tensor([1, 1]))  # as many rows as the buffer: rows copied in place
    keys, values = layer.update(k[:, :, :1], -k[:, :, :1])
    assert keys.shape == (2, 1, 4, 2) and keys[:, :, :3].tolist() == [k[1].tolist(), k[1].tolist()]
    assert values[:, :, 3].tolist() == (-k[:, :, 0]).tolist()
