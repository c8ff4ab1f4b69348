"""One decode step of a Llama-family model (llama, mistral, qwen2) in a handful of fused tensor ops.

On a CPU a decode step of a small model is bound by small tensor ops, not by arithmetic: profiled
on the tiny preset at 256 rows, transformers' forward spends under a third of its time in the
linear layers, about as much in SDPA's CPU flash kernel (slow for a single query token), and the
rest in ~45 small ops per layer (RMSNorm, rotary embedding, casts, residual adds). This step computes the same function with fewer ops:
- q, k and v come from one matmul with a weight stacked once per `sample` call, and the rotary
  embedding of q and k together is x * cos + swap_halves(x) * sin' with sin' = [-sin1, sin2]
  (transformers' x * cos + rotate_half(x) * sin, whose rotate_half = [-x2, x1]): three ops;
- the attention scale is folded into the q weights; attention is two batched matmuls and a
  softmax over the filled cache prefix with an additive mask, grouped-query heads without copies;
- gate and up projections are one matmul; the residual adds ride on `addmm`.
Every other model, a PEFT-wrapped one, autocast and non-fp32 weights use transformers' forward.
The sampler's tests compare both paths (tests/test_sampler.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from temper.rollout.kv_cache import SlabCache

_FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}


class LlamaDecodeStep:
    """Logits of the next token for one new token per row, reading and extending a `SlabCache`.

    Build it with `LlamaDecodeStep.build(model)` (None when the model is not one this step
    reproduces) at the start of a `sample` call: it stacks the current weights, so it must be
    rebuilt after the weights change."""

    def __init__(self, model: nn.Module):
        base = model.model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.final_norm = (base.norm.weight, base.norm.variance_epsilon)
        self.lm_head = model.lm_head.weight
        self.layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            scale = attn.scaling
            wq, wk, wv = attn.q_proj.weight * scale, attn.k_proj.weight, attn.v_proj.weight
            bias = None
            if attn.q_proj.bias is not None:
                bias = torch.cat([attn.q_proj.bias * scale, attn.k_proj.bias, attn.v_proj.bias])
            self.layers.append(
                (
                    (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                    torch.cat([wq, wk, wv]),
                    bias,
                    attn.o_proj.weight.t(),
                    attn.o_proj.bias,
                    (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                    torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]),
                    mlp.down_proj.weight.t(),
                    mlp.down_proj.bias,
                )
            )
        self.intermediate = config.intermediate_size

    @classmethod
    def build(cls, model: nn.Module) -> LlamaDecodeStep | None:
        """The step for `model`, or None where it would not compute transformers' function exactly
        (another architecture, adapters or hooks on the modules, autocast, non-fp32 weights)."""
        config = getattr(model, "config", None)
        prefix = _FAMILIES.get(getattr(config, "model_type", None))
        if prefix is None or type(model).__name__ != f"{prefix}ForCausalLM":
            return None
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
            return None
        device = next(model.parameters()).device
        if torch.is_autocast_enabled(device.type) or any(
            p.dtype != torch.float32 for p in model.parameters()
        ):
            return None
        base = getattr(model, "model", None)
        if type(base).__name__ != f"{prefix}Model" or type(model.lm_head) is not nn.Linear:
            return None
        if type(base.embed_tokens) is not nn.Embedding or type(base.norm).__name__ != f"{prefix}RMSNorm":
            return None
        expected = {
            "self_attn": f"{prefix}Attention",
            "mlp": f"{prefix}MLP",
            "input_layernorm": f"{prefix}RMSNorm",
            "post_attention_layernorm": f"{prefix}RMSNorm",
            "q_proj": "Linear",
            "k_proj": "Linear",
            "v_proj": "Linear",
            "o_proj": "Linear",
            "gate_proj": "Linear",
            "up_proj": "Linear",
            "down_proj": "Linear",
            "act_fn": "SiLUActivation",
        }
        for layer in base.layers:
            if type(layer).__name__ != f"{prefix}DecoderLayer":
                return None
            for name, module in layer.named_modules():
                leaf = name.rsplit(".", 1)[-1]
                if name and expected.get(leaf) != type(module).__name__:
                    return None  # an adapter (LoRA), an extra norm (Qwen3's q_norm) or a new module
        if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
            return None
        return cls(model)

    def __call__(
        self,
        token_A: torch.Tensor,
        position_A: torch.Tensor,
        cache: SlabCache,
        mask_A_L: torch.Tensor,
    ) -> torch.Tensor:
        """token_A: the new token of each row; position_A: its position id; mask_A_L: additive
        mask (0 or -inf) over the cache after this token is written (L = cache length + 1).
        -> logits_A_V."""
        rows, h, kv, d = token_A.shape[0], self.heads, self.kv_heads, self.head_dim
        group = h // kv
        x_A_E = F.embedding(token_A, self.embed)
        cos_A_1_D, sin_A_1_D = self.rotary(x_A_E, position_A[:, None])  # (A, 1, D) each
        half = d // 2
        sin_A_1_D = torch.cat((-sin_A_1_D[..., :half], sin_A_1_D[..., half:]), dim=-1)
        length = cache.get_seq_length()
        mask_A_1_1_L = mask_A_L[:, None, None, :]
        for (norm1, w_qkv, b_qkv, wo_t, bo, norm2, w_gu, b_gu, wd_t, bd), layer in zip(
            self.layers, cache.layers, strict=True
        ):
            hid_A_E = F.rms_norm(x_A_E, (x_A_E.shape[-1],), norm1[0], norm1[1])
            proj_A_P = F.linear(hid_A_E, w_qkv, b_qkv)
            q_end, k_end, v_end = h * d, (h + kv) * d, (h + 2 * kv) * d
            qk_A_N_D = proj_A_P[:, :k_end].view(rows, h + kv, d)  # q and k heads, rotated together
            qk_A_N_D = torch.addcmul(qk_A_N_D * cos_A_1_D, qk_A_N_D.roll(half, dims=-1), sin_A_1_D)
            if not layer.is_initialized:
                raise RuntimeError("the cache must be prefilled before a decode step")
            layer.keys[:rows, :, length] = qk_A_N_D[:, h:]
            layer.values[:rows, :, length] = proj_A_P[:, k_end:v_end].view(rows, kv, d)
            keys_A_K_L_D = layer.keys[:rows, :, : length + 1]
            values_A_K_L_D = layer.values[:rows, :, : length + 1]
            q_A_K_G_D = qk_A_N_D[:, :h].view(rows, kv, group, d)
            scores_A_K_G_L = torch.matmul(q_A_K_G_D, keys_A_K_L_D.transpose(-1, -2)).add_(mask_A_1_1_L)
            attn_A_K_G_D = torch.matmul(torch.softmax(scores_A_K_G_L, dim=-1), values_A_K_L_D)
            x_A_E = torch.addmm(x_A_E, attn_A_K_G_D.reshape(rows, q_end), wo_t)
            if bo is not None:
                x_A_E = x_A_E + bo
            hid_A_E = F.rms_norm(x_A_E, (x_A_E.shape[-1],), norm2[0], norm2[1])
            gu_A_F2 = F.linear(hid_A_E, w_gu, b_gu)
            act_A_F = F.silu(gu_A_F2[:, : self.intermediate]).mul_(gu_A_F2[:, self.intermediate :])
            x_A_E = torch.addmm(x_A_E, act_A_F, wd_t)
            if bd is not None:
                x_A_E = x_A_E + bd
        for layer in cache.layers:
            layer.length = length + 1
        x_A_E = F.rms_norm(x_A_E, (x_A_E.shape[-1],), self.final_norm[0], self.final_norm[1])
        return F.linear(x_A_E, self.lm_head)
