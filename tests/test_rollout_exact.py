"""The rollout package's pure parts on hand-computed values: which tokens top-p and top-k keep (a
distribution of halves and quarters, and the uniform number that picks between them), the stop ids
a sampler stops at, the attention masks per attention kind and dtype, and the slab cache's sizes.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from temper.rollout.kv_cache import AttentionMask, SlabLayer
from temper.rollout.sampler import sampler_stop_ids
from temper.rollout.sampling import choose_tokens

# probabilities 1/2, 1/4, 1/8, 1/8: exact in floating point
LOGITS = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))


def _pick(u, rows=1, **kw):
    tokens, logp = choose_tokens(
        LOGITS.repeat(rows, 1), temperature=1.0, uniform_B=torch.full((rows,), u), **kw
    )
    return tokens.tolist(), logp.tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    """top_p 0.75: the tokens before token 2 hold 0.75 already, so only tokens 0 and 1 stay, renormalized
    to 2/3 and 1/3; u = 0.9 falls in token 1's share (in token 3's without truncation)."""
    assert _pick(0.9)[0] == [3]  # untruncated CDF: 0.5, 0.75, 0.875, 1
    tokens, logp = _pick(0.9, rows=2, top_p=0.75)
    assert tokens == [1, 1] and logp == pytest.approx([math.log(0.25)] * 2)  # logprob before truncation
    assert _pick(0.6, top_p=0.75)[0] == [0]  # 0.6 < 2/3
    assert _pick(0.7, top_p=0.75)[0] == [1]
    # top_p 0.8: token 2 (0.75 before it) stays: 4/7, 2/7, 1/7, and 0.9 falls in its share
    assert _pick(0.9, top_p=0.8)[0] == [2]


def test_top_k_keeps_the_k_largest():
    assert _pick(0.9, top_k=2)[0] == [1]  # tokens 0 and 1: 2/3 and 1/3
    assert _pick(0.9, rows=3, top_k=2)[0] == [1, 1, 1]
    assert _pick(0.99, top_k=4)[0] == [3]  # k = vocabulary: nothing dropped


def test_stop_ids_are_eos_then_the_models_then_the_engines():
    tokenizer = SimpleNamespace(eos_token_id=5)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[5, 11]))
    sampler = SimpleNamespace(model=model, stop_token_ids=[9, "42", 7, 5])  # 5 is there already
    assert sampler_stop_ids(sampler, tokenizer) == [5, 11, 9, 42, 7]
    assert sampler_stop_ids(SimpleNamespace(), tokenizer) == [5]


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


def test_fast_decode_with_every_bias_and_scaled_norms_equals_model_forward(tokenizer):
    """A Llama with biases on every projection (attention and MLP) and RMSNorm weights that are not
    ones: the fast decode step must read each of them to give transformers' tokens and logprobs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from temper.rollout import HFSampler
    from temper.rollout.fast_decode import LlamaDecodeStep

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=48, attention_bias=True, mlp_bias=True,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 2.0)
    assert LlamaDecodeStep.build(model) is not None  # the fast path is the one under test
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("hi there", "2+2=")]
    kw = dict(max_new_tokens=6, temperature=1.0, seed=3)
    fast = HFSampler(model, tokenizer).sample(prompts, 2, **kw)
    reference = HFSampler(model, tokenizer, fast_decode=False).sample(prompts, 2, **kw)
    for r1, r2 in zip(fast, reference, strict=True):
        for s1, s2 in zip(r1, r2, strict=True):
            assert s1.token_ids == s2.token_ids
            torch.testing.assert_close(
                torch.tensor(s1.logprobs), torch.tensor(s2.logprobs), atol=1e-5, rtol=0
            )


def test_stop_strings_are_found_in_the_first_tokens_and_across_skipped_special_tokens(tokenizer):
    from temper.rollout.hf_sampler import _StopStrings

    a, b = (tokenizer.encode(c, add_special_tokens=False) for c in ("a", "b"))
    assert len(a) == len(b) == 1
    stops = _StopStrings(tokenizer, ["ab"], rows=2)
    rows, live = torch.tensor([0, 1]), torch.tensor([True, True])
    assert stops.step(torch.tensor([a[0], a[0]]), rows, live) == []
    # row 0: "a" then "b" (the second token); row 1: an end token between "a" and "b"
    assert stops.step(torch.tensor([b[0], tokenizer.eos_token_id]), rows, live) == [0]
    assert stops.step(torch.tensor([b[0], b[0]]), rows, torch.tensor([False, True])) == [1]
