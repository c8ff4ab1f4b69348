"""Tiny Llama-architecture presets trained from scratch, so every stage runs with no hub.

Sizes follow a measurement made before the presets existed (BENCHMARKS.md, "Machines and
limits"): in a fixed CPU budget the number of optimizer steps, not the parameter count, decides
what a from-scratch model learns (0.5M params learned 2-digit addition to 97% in 3 CPU-minutes,
2M only 16%), so the default `tiny` is ~1M parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerBase,
        Qwen3Config,
        Qwen3ForCausalLM,
    )


PRESETS: dict[str, dict[str, int]] = {
    # name: hidden, layers, heads, ffn; parameter counts with the built-in 263-token vocab
    "nano": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1024),
}


def preset_config(
    name: str, tokenizer: PreTrainedTokenizerBase, max_len: int = 512, qk_norm: bool = False
) -> LlamaConfig | Qwen3Config:
    """The preset's config: Llama, or with `qk_norm` Qwen3 at the same sizes (Qwen3's decoder
    layer is Llama's with an RMSNorm over each head's queries and keys before RoPE; its head_dim
    and key/value heads are set to Llama's, hidden / heads and one per query head)."""
    from transformers import LlamaConfig, Qwen3Config

    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    sizes = PRESETS[name]
    common = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_len,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sizes,
    )
    if not qk_norm:
        return LlamaConfig(**common)
    return Qwen3Config(
        **common,
        head_dim=sizes["hidden_size"] // sizes["num_attention_heads"],
        num_key_value_heads=sizes["num_attention_heads"],
        rms_norm_eps=1e-6,
        attention_bias=False,
        use_sliding_window=False,
    )


def build_preset(
    name: str, tokenizer: PreTrainedTokenizerBase, seed: int = 0, qk_norm: bool = False
) -> LlamaForCausalLM | Qwen3ForCausalLM:
    """A freshly initialized preset model (fp32), deterministic in `seed` (`qk_norm`: Qwen3)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = preset_config(name, tokenizer, qk_norm=qk_norm)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model
