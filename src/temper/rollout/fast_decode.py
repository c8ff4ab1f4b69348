"""Decode steps of a Llama-family model (llama, mistral, qwen2) on a CPU in fewer tensor ops.

A CPU decode step of a small model is bound by its many small tensor ops, not by arithmetic:
profiled on the tiny preset at 256 rows (64 prompts x 4 samples), transformers' forward spent
under a third of its time in the linear layers, about as much in SDPA's CPU flash kernel (slow for
one query token) and the rest in dozens of small ops per layer (RMSNorm, rotary embedding, casts,
residual adds), and the sampler copied each prompt's cache to its rows. `LlamaDecodeStep`
computes the same function as transformers' forward, up to rounding:
- q, k and v come from one matmul, gate and up from another, with weights stacked once per
  `sample` call and stored (in, out), the layout MKL runs fastest at a few hundred rows; the
  attention scale is folded into the q weights; residual adds ride on `addmm`;
- the rotary embedding of q and k together is x * cos + swap_halves(x) * sin' with
  sin' = [-sin1, sin2], i.e. transformers' x * cos + rotate_half(x) * sin with
  rotate_half(x) = [-x2, x1], with cos and sin looked up in a table per step;
- attention is shared-prefix attention (`SharedPrefixDecoder`): each prompt's keys/values are
  read once for all its samples.
Measured with benchmarks/sampler_speed.py (tiny preset, 2 cores, fairly quiet, one process in
alternating rounds): 1.33-1.37x the tokens/s of the generic path on RL-shaped batches (64 x 4 x 32,
8 x 8 x 32, 16 x 8 x <=128 with rows stopping), 1.18x at one sample per prompt; about 21% of the
compute bound at 64 x 4 x 32 against 15%. What remains is about 45% linear layers (near the
matmul peak) and 40% attention, which runs at memory speed.
Other models, PEFT adapters, hooks, autocast, non-fp32 weights and non-CPU devices keep
transformers' forward (the sampler's generic path); tests/test_sampler.py compares both paths.

Not used: `torch.compile`. Measured on the tiny preset under load: compiling the model's
forward (dynamic shapes) took ~3 minutes at its first call, and compiling this decoder's step
took ~5 minutes (it recompiles for each cache length until dynamo's recompile limit) and then ran
at 0.82x eager (8 x 8 x 32, one core). Every new batch size (a chunk, rows dropped at eos) would
compile again, which the sampling of an RL step cannot repay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from torch import nn

    from temper.rollout.kv_cache import SlabCache


_FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}


def _linear(x_A_I: torch.Tensor, w_I_O: torch.Tensor, b_O: torch.Tensor | None) -> torch.Tensor:
    """x @ w (+ b) with w stored (in, out) contiguous: for a few hundred rows MKL runs this
    layout up to 1.5x faster than `F.linear`'s transposed (out, in) weight (measured on the tiny
    preset's shapes)."""
    import torch

    return torch.mm(x_A_I, w_I_O) if b_O is None else torch.addmm(b_O, x_A_I, w_I_O)


def _acting_hooks(module: nn.Module) -> list:
    """The module's forward (pre-)hooks, less transformers' output-capturing hooks: a forward with
    `output_hidden_states=True` (the RL update's) installs those on every layer for good, and they
    do nothing unless that forward asks for outputs, which the decode step never does. Matched by
    their function's name, so a renamed one in a later transformers only costs the fast path."""
    hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
    return [
        h for h in hooks if not getattr(h, "__qualname__", "").startswith("install_output_capuring_hook.")
    ]


class LlamaDecodeStep:
    """Logits of the next token for one new token per row, reading and extending a `SlabCache`.

    Build it with `LlamaDecodeStep.build(model)` (None when the model is not one this step
    reproduces) at the start of a `sample` call: it copies the current weights, so it must be
    rebuilt after they change."""

    def __init__(self, model: nn.Module):
        import torch

        base = model.model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.final_norm = (base.norm.weight, base.norm.variance_epsilon)
        self.lm_head_t = model.lm_head.weight.t().contiguous()
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
                    torch.cat([wq, wk, wv]).t().contiguous(),
                    bias,
                    attn.o_proj.weight.t().contiguous(),
                    attn.o_proj.bias,
                    (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                    torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
                    None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]),
                    mlp.down_proj.weight.t().contiguous(),
                    mlp.down_proj.bias,
                )
            )
        self.intermediate = config.intermediate_size

    @classmethod
    def build(cls, model: nn.Module) -> LlamaDecodeStep | None:
        """The step for `model`, or None where it would not compute transformers' function exactly
        (another architecture, adapters or hooks on the modules, autocast, non-fp32 weights, a
        rotary embedding that depends on the sequence length), or off a CPU, where the model's own
        kernels are the better choice."""
        import torch
        from torch import nn

        config = getattr(model, "config", None)
        prefix = _FAMILIES.get(getattr(config, "model_type", None))
        if prefix is None or type(model).__name__ != f"{prefix}ForCausalLM":
            return None
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
            return None
        device = next(model.parameters()).device
        if (
            device.type != "cpu"
            or torch.is_autocast_enabled(device.type)
            or any(p.dtype != torch.float32 for p in model.parameters())
        ):
            return None
        base = getattr(model, "model", None)
        if type(base).__name__ != f"{prefix}Model" or type(model.lm_head) is not nn.Linear:
            return None
        if type(base.embed_tokens) is not nn.Embedding or type(base.norm).__name__ != f"{prefix}RMSNorm":
            return None
        if getattr(base.rotary_emb, "rope_type", "default") in ("dynamic", "longrope"):
            return None  # their frequencies change with the sequence length: the table would differ
        expected = {
            "self_attn": f"{prefix}Attention",
            "mlp": f"{prefix}MLP",
            "input_layernorm": f"{prefix}RMSNorm",
            "post_attention_layernorm": f"{prefix}RMSNorm",
            "act_fn": "SiLUActivation",
        }
        projections = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
        for layer in base.layers:
            if type(layer).__name__ != f"{prefix}DecoderLayer":
                return None
            for name, module in layer.named_modules():
                leaf = name.rsplit(".", 1)[-1]
                if not name:
                    continue
                # exactly torch's Linear: PEFT's LoRA layer is also a class named "Linear"
                if leaf in projections:
                    known = type(module) is nn.Linear
                else:
                    known = expected.get(leaf) == type(module).__name__
                if not known:
                    return None  # an adapter (LoRA), an extra norm (Qwen3's q_norm) or a new module
        if any(_acting_hooks(m) for m in model.modules()):
            return None
        return cls(model)

    def decoder(
        self, prefill: SlabCache, src_R: list[int], valid_U_W: torch.Tensor, max_new_tokens: int
    ) -> SharedPrefixDecoder:
        """A decoder whose rows continue prompts src_R over `prefill`, the cache of the distinct
        prompts (valid_U_W: their non-padding positions)."""
        return SharedPrefixDecoder(self, prefill, src_R, valid_U_W, max_new_tokens)


class SharedPrefixDecoder:
    """Decode steps of rows that share prompts, reading each prompt's keys/values once.

    Attention over a row's cache is split into the prompt part, kept once per distinct prompt
    (U, heads, W, D), and the generated part, kept per row (A, heads, T, D): the prompt's keys are
    multiplied with the queries of all its rows in one matmul over a (prompt, sample) grid of
    U x n slots (a dead or missing row leaves its slot unused), and one softmax runs over both
    parts, so the result is the attention over the whole cache. With 4-8 samples per prompt this
    reads several times fewer prompt key/value bytes per step (the batched matmuls of one-token
    attention run at memory speed here: their time grows linearly with the cache length), and
    the prompt cache is never copied to the rows."""

    def __init__(
        self,
        step: LlamaDecodeStep,
        prefill: SlabCache,
        src_R: list[int],
        valid_U_W: torch.Tensor,
        max_new_tokens: int,
    ):
        import torch

        self.step = step
        rows, width = len(src_R), valid_U_W.shape[1]
        device = valid_U_W.device
        # slot of row r in the (prompt, sample) grid: prompt src_R[r], its k-th row
        count: dict[int, int] = {}
        ranks = []
        for u in src_R:
            ranks.append(count.get(u, 0))
            count[u] = ranks[-1] + 1
        self.n = max(count.values())
        self.slot_A = torch.tensor([u * self.n + k for u, k in zip(src_R, ranks, strict=True)], device=device)
        self.prompts = valid_U_W.shape[0]
        self._check_identity()
        self.prefix = [(layer.keys[:, :, :width], layer.values[:, :, :width]) for layer in prefill.layers]
        self.prefix_mask_U_W = torch.zeros(valid_U_W.shape, device=device).masked_fill_(
            ~valid_U_W, float("-inf")
        )
        kv, d = step.kv_heads, step.head_dim
        dtype = prefill.layers[0].keys.dtype
        self.suffix = [
            (
                torch.empty((rows, kv, max_new_tokens, d), dtype=dtype, device=device),
                torch.empty((rows, kv, max_new_tokens, d), dtype=dtype, device=device),
            )
            for _ in prefill.layers
        ]
        self.length = 0  # generated positions in the cache
        # rotary cos / sin of every position a row can reach (positions count real tokens, so
        # fewer than width + max_new_tokens), looked up per step instead of recomputed; the sin
        # half that multiplies x2 is negated: x * cos + swap_halves(x) * sin' is
        # x * cos + rotate_half(x) * sin
        positions_1_P = torch.arange(width + max_new_tokens, device=device)[None]
        cos_1_P_D, sin_1_P_D = step.rotary(step.embed[:1][None], positions_1_P)
        half = step.head_dim // 2
        self.cos_P_D = cos_1_P_D[0]
        self.sin_P_D = torch.cat((-sin_1_P_D[0, :, :half], sin_1_P_D[0, :, half:]), dim=-1)

    def _check_identity(self) -> None:
        """Rows fill the grid in order (every prompt has n live rows): no scatter or gather."""
        import torch

        slots = self.prompts * self.n
        self.identity = len(self.slot_A) == slots and bool(
            (self.slot_A == torch.arange(slots, device=self.slot_A.device)).all()
        )

    def select_rows(self, keep_A: torch.Tensor) -> None:
        """Keep rows keep_A (in order); prompts left without rows are dropped from the prefix."""
        import torch

        n, t = len(keep_A), self.length
        for keys, values in self.suffix:
            keys[:n, :, :t] = keys[keep_A, :, :t]
            values[:n, :, :t] = values[keep_A, :, :t]
        slot_A = self.slot_A[keep_A]
        prompt_A = slot_A // self.n
        live_U = torch.unique(prompt_A)
        if len(live_U) < self.prompts:
            remap = torch.full((self.prompts,), -1, dtype=torch.long, device=slot_A.device)
            remap[live_U] = torch.arange(len(live_U), device=slot_A.device)
            slot_A = remap[prompt_A] * self.n + slot_A % self.n
            self.prefix = [(k[live_U], v[live_U]) for k, v in self.prefix]
            self.prefix_mask_U_W = self.prefix_mask_U_W[live_U]
            self.prompts = len(live_U)
        self.slot_A = slot_A
        self._check_identity()

    def _to_grid(self, x_A: torch.Tensor, buffer: torch.Tensor | None) -> torch.Tensor:
        """(A, kv, g, X) rows -> (U, kv, n * g, X) grid; unused slots hold stale finite values."""
        if not self.identity:
            assert buffer is not None
            x_A = buffer.index_copy_(0, self.slot_A, x_A)
        u, n = self.prompts, self.n
        _, kv, g, x = x_A.shape
        return x_A.view(u, n, kv, g, x).transpose(1, 2).reshape(u, kv, n * g, x)

    def _from_grid(self, x_U: torch.Tensor, group: int) -> torch.Tensor:
        """(U, kv, n * g, X) grid -> (A, kv, g, X) rows."""
        u, kv, _, x = x_U.shape
        x_S = x_U.view(u, kv, self.n, group, x).transpose(1, 2).reshape(u * self.n, kv, group, x)
        return x_S if self.identity else x_S.index_select(0, self.slot_A)

    def __call__(self, token_A: torch.Tensor, position_A: torch.Tensor) -> torch.Tensor:
        """token_A: the new token of each live row; position_A: its position id -> logits_A_V."""
        import torch
        import torch.nn.functional as F

        step = self.step
        rows, h, kv, d = token_A.shape[0], step.heads, step.kv_heads, step.head_dim
        group, half, t = h // kv, d // 2, self.length
        width = self.prefix_mask_U_W.shape[1]
        x_A_E = F.embedding(token_A, step.embed)
        cos_A_1_D = self.cos_P_D[position_A][:, None]
        sin_A_1_D = self.sin_P_D[position_A][:, None]
        mask_U_1_1_W = self.prefix_mask_U_W[:, None, None, :]
        slots = self.prompts * self.n
        q_buffer = None if self.identity else x_A_E.new_zeros((slots, kv, group, d))
        p_buffer = None if self.identity else x_A_E.new_zeros((slots, kv, group, width))
        for (norm1, w_qkv, b_qkv, wo_t, bo, norm2, w_gu, b_gu, wd_t, bd), (keys_U, values_U), (
            keys_R,
            values_R,
        ) in zip(step.layers, self.prefix, self.suffix, strict=True):
            hid_A_E = F.rms_norm(x_A_E, (x_A_E.shape[-1],), norm1[0], norm1[1])
            proj_A_P = _linear(hid_A_E, w_qkv, b_qkv)
            k_end, v_end = (h + kv) * d, (h + 2 * kv) * d
            qk_A_N_D = proj_A_P[:, :k_end].view(rows, h + kv, d)  # q and k heads, rotated together
            qk_A_N_D = torch.addcmul(qk_A_N_D * cos_A_1_D, qk_A_N_D.roll(half, dims=-1), sin_A_1_D)
            keys_R[:rows, :, t] = qk_A_N_D[:, h:]
            values_R[:rows, :, t] = proj_A_P[:, k_end:v_end].view(rows, kv, d)
            q_A_K_G_D = qk_A_N_D[:, :h].view(rows, kv, group, d)
            # scores against the prompt (per distinct prompt) and the generated part (per row)
            q_U_K_M_D = self._to_grid(q_A_K_G_D, q_buffer)
            prompt_U_K_M_W = torch.matmul(q_U_K_M_D, keys_U.transpose(-1, -2)).add_(mask_U_1_1_W)
            own_A_K_G_T = torch.matmul(q_A_K_G_D, keys_R[:rows, :, : t + 1].transpose(-1, -2))
            scores_A_K_G_L = torch.cat((self._from_grid(prompt_U_K_M_W, group), own_A_K_G_T), dim=-1)
            probs_A_K_G_L = torch.softmax(scores_A_K_G_L, dim=-1)
            out_U_K_M_D = torch.matmul(self._to_grid(probs_A_K_G_L[..., :width], p_buffer), values_U)
            attn_A_K_G_D = torch.matmul(probs_A_K_G_L[..., width:], values_R[:rows, :, : t + 1])
            attn_A_K_G_D += self._from_grid(out_U_K_M_D, group)
            x_A_E = torch.addmm(x_A_E, attn_A_K_G_D.reshape(rows, h * d), wo_t)
            if bo is not None:
                x_A_E = x_A_E + bo
            hid_A_E = F.rms_norm(x_A_E, (x_A_E.shape[-1],), norm2[0], norm2[1])
            gu_A_F2 = _linear(hid_A_E, w_gu, b_gu)
            act_A_F = F.silu(gu_A_F2[:, : step.intermediate]).mul_(gu_A_F2[:, step.intermediate :])
            x_A_E = torch.addmm(x_A_E, act_A_F, wd_t)
            if bd is not None:
                x_A_E = x_A_E + bd
        self.length = t + 1
        x_A_E = F.rms_norm(x_A_E, (x_A_E.shape[-1],), step.final_norm[0], step.final_norm[1])
        return torch.mm(x_A_E, step.lm_head_t)
