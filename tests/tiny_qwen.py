"""A Qwen2-style base built locally, as a user's own model would come: a trained byte-level BPE
tokenizer whose eos is `<|endoftext|>`, with ChatML's `<|im_start|>`/`<|im_end|>` in its vocabulary
but no chat template, and a tiny Qwen2ForCausalLM. No download."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CORPUS = ["What is 12+34? Answer: 46", "user assistant system hello world", "0123456789 +-*/= ()"] * 20


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT)


def build_model(tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def always_emit(model: Qwen2ForCausalLM, token_id: int) -> Qwen2ForCausalLM:
    """Make `model` predict `token_id` after any input: every embedding is the same vector and the
    blocks add nothing to the residual stream, so the final hidden state is constant, and only the
    chosen token's output row is non-zero."""
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[token_id] = 1.0
    return model
