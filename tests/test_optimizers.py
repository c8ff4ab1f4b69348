"""`train.optimizer: muon` and the QK-norm preset (issue 29 item 1): Muon on the 2-D hidden weights
and AdamW on the rest, each step equal to the reference updates on the same tensors, one lr for
both groups, exact resume; the qk_norm preset is Qwen3 at the preset's sizes, loadable through the
Auto classes; neither setting changes the hash of a recipe that does not use it."""

from __future__ import annotations

import math

import pytest
import torch

from temper.models import build_preset
from temper.train.optimizers import MuonWithAdamW, build_optimizer, muon_split
from temper.train.supervised import TrainConfig


def _names(model, params):
    ids = {id(p) for p in params}
    return {
        n.split(".")[-2] if n.endswith("weight") else n for n, p in model.named_parameters() if id(p) in ids
    }


def test_muon_takes_the_hidden_matrices_and_adamw_the_embeddings_head_and_vectors(tokenizer):
    model = build_preset("nano", tokenizer)
    muon, rest = muon_split(model)
    assert _names(model, muon) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert _names(model, rest) == {
        "embed_tokens",
        "lm_head",
        "input_layernorm",
        "post_attention_layernorm",
        "norm",
    }
    assert len(muon) + len(rest) == len(list(model.parameters()))
    frozen = build_preset("nano", tokenizer)
    frozen.model.layers[0].self_attn.q_proj.requires_grad_(False)
    assert len(muon_split(frozen)[0]) == len(muon) - 1  # only trainable parameters


# The reference: Keller Jordan's Newton-Schulz iteration (KellerJordan/Muon, muon.py,
# zeropower_via_newtonschulz5) and Moonshot's update scaled to AdamW's RMS (MoonshotAI/Moonlight,
# "Muon is scalable for LLM training": adjusted_lr = lr * 0.2 * sqrt(max(A, B))), transcribed.
def _ns5(G, steps=5):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def _reference_muon_step(p, grad, buf, lr, wd, beta=0.95):
    buf.lerp_(grad, 1 - beta)
    update = grad.lerp(buf, beta)  # nesterov
    o = _ns5(update).to(p.dtype)
    p.mul_(1 - lr * wd)
    p.add_(o, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


def test_a_step_is_the_reference_muon_update_and_adamws_own(tokenizer):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer)
    config = TrainConfig(optimizer="muon", lr=0.02, weight_decay=0.1, betas=(0.9, 0.95), muon_momentum=0.95)
    optimizer = build_optimizer(model, config)
    assert isinstance(optimizer, MuonWithAdamW)
    muon, rest = muon_split(model)
    ref_muon = [p.detach().clone() for p in muon]
    bufs = [torch.zeros_like(p) for p in muon]
    ref_rest = [torch.nn.Parameter(p.detach().clone()) for p in rest]
    ref_adamw = torch.optim.AdamW(
        [{"params": [q for q, p in zip(ref_rest, rest) if p.ndim >= 2], "weight_decay": 0.1},
         {"params": [q for q, p in zip(ref_rest, rest) if p.ndim < 2], "weight_decay": 0.0}],
        lr=0.02, betas=(0.9, 0.95),
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    for _ in range(2):  # the second step reads the momentum of the first
        grads = {id(p): torch.randn(p.shape, generator=g) for p in model.parameters()}
        for p in model.parameters():
            p.grad = grads[id(p)].clone()
        optimizer.step()
        for p, q, buf in zip(muon, ref_muon, bufs, strict=True):
            _reference_muon_step(q, grads[id(p)].clone(), buf, lr=0.02, wd=0.1)
        for p, q in zip(rest, ref_rest, strict=True):
            q.grad = grads[id(p)].clone()
        ref_adamw.step()
    for p, q in zip(rest, ref_rest, strict=True):
        assert torch.equal(p.detach(), q.detach())
    for p, q in zip(muon, ref_muon, strict=True):
        # both orthogonalize in bf16, torch with a fused addmm: equal to bf16 rounding of the update
        moved = (q - p.detach()).abs().max() / (0.02 * 0.2 * math.sqrt(max(p.shape)))
        assert moved < 0.05, float(moved)
    # the scale is AdamW's RMS match, not Keller Jordan's max(1, A/B)**0.5: a real difference here
    assert 0.2 * math.sqrt(max(muon[0].shape)) != max(1, muon[0].shape[0] / muon[0].shape[1]) ** 0.5


def test_the_schedules_lr_reaches_both_groups_and_a_resume_is_exact(tokenizer, tmp_path):
    import random

    from temper.data import build_sequences, parse_row
    from temper.train import NextToken, train_supervised

    rng = random.Random(0)
    rows = [parse_row({"text": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}"}, "x", i) for i in range(24)]
    data = build_sequences(tokenizer, rows, max_len=32)[0]
    config = TrainConfig(
        max_steps=4, batch_size=4, lr=3e-3, warmup_steps=1, log_every=1, save_every=2, progress=False,
        optimizer="muon",
    )  # fmt: skip
    lrs = []

    class Stop(Exception):
        pass

    def run(out, stop=None):
        torch.manual_seed(0)
        model = build_preset("nano", tokenizer)

        def seen(step, row):
            lrs.append(row["lr"])
            if step == stop:
                raise Stop

        train_supervised(
            model, data, config, out, objective=NextToken(tokenizer.pad_token_id), callbacks=[seen]
        )
        return model

    full = run(tmp_path / "full")
    assert len(set(lrs)) > 1
    with pytest.raises(Stop):
        run(tmp_path / "cut", stop=3)
    resumed = run(tmp_path / "cut")
    a, b = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    adamw = TrainConfig(**{**config.__dict__, "optimizer": "adamw"})
    torch.manual_seed(0)
    other = build_preset("nano", tokenizer)
    train_supervised(other, data, adamw, tmp_path / "adamw", objective=NextToken(tokenizer.pad_token_id))
    assert not torch.equal(
        other.state_dict()["model.layers.0.mlp.up_proj.weight"], a["model.layers.0.mlp.up_proj.weight"]
    )


def test_the_qk_norm_preset_is_qwen3_at_the_presets_sizes_and_loads_through_the_auto_classes(
    tokenizer, tmp_path
):
    from transformers import AutoModelForCausalLM

    from temper.rollout import HFSampler

    model = build_preset("nano", tokenizer, seed=1, qk_norm=True)
    plain = build_preset("nano", tokenizer, seed=1)
    attention = model.model.layers[0].self_attn
    assert type(model).__name__ == "Qwen3ForCausalLM" and hasattr(attention, "q_norm")
    assert attention.q_proj.weight.shape == plain.model.layers[0].self_attn.q_proj.weight.shape
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 2 * 2 * (64 // 4)  # a q and a k gain of head_dim per layer, 2 layers
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 12]])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    [[sample]] = HFSampler(loaded, tokenizer).sample(
        [[1, 5, 9]], 1, max_new_tokens=4, temperature=1.0, seed=0
    )
    assert len(sample.token_ids) == 4


def test_the_new_settings_leave_recipes_that_do_not_use_them_as_hashed():
    from temper.recipe import ModelSpec
    from temper.stages.markers import stage_settings
    from temper.stages.sft import SFTStage

    assert "qk_norm" not in ModelSpec(preset="tiny").weights()
    assert ModelSpec(preset="tiny", qk_norm=True).weights()["qk_norm"] is True
    with pytest.raises(ValueError, match="qk_norm builds a preset"):
        ModelSpec(path="x", qk_norm=True)
    stage = SFTStage(kind="sft", data={"tasks": ["arithmetic"]})
    assert "optimizer" not in stage_settings(stage)["train"]
    muon = SFTStage(kind="sft", data={"tasks": ["arithmetic"]}, train=TrainConfig(optimizer="muon"))
    assert stage_settings(muon)["train"]["optimizer"] == "muon"
