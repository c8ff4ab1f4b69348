import pytest
import torch

from temper.models import (
    ModelNotFoundError,
    build_preset,
    load_model,
    load_tokenizer,
    save_model,
    save_trained,
    with_lora,
)


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_preset_saves_and_reloads_with_identical_logits(nano, tokenizer, tmp_path):
    save_model(nano, tokenizer, tmp_path / "m")
    again = load_model(tmp_path / "m")
    ids = tokenizer("12+34=46")["input_ids"]
    assert type(again).__name__ == "LlamaForCausalLM"
    assert torch.equal(_logits(nano, ids), _logits(again, ids))
    assert load_tokenizer(tmp_path / "m")("ab")["input_ids"] == [97, 98]


def test_save_is_atomic_no_partial_dir_on_failure(nano, tokenizer, tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", boom)
    with pytest.raises(RuntimeError):
        save_model(nano, tokenizer, tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_presets_have_the_documented_sizes(tokenizer):
    sizes = {
        name: sum(p.numel() for p in build_preset(name, tokenizer).parameters()) for name in ("nano", "tiny")
    }
    assert 100_000 < sizes["nano"] < 300_000
    assert 1_000_000 < sizes["tiny"] < 2_000_000


def test_preset_init_is_seeded(tokenizer):
    a, b = build_preset("nano", tokenizer, seed=3), build_preset("nano", tokenizer, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_lora_merge_gives_the_adapter_models_logits(nano, tokenizer, tmp_path):
    ids = tokenizer("7*8=56")["input_ids"]
    base = _logits(nano, ids)
    assert with_lora(nano, None) is nano
    peft_model = with_lora(nano, {"r": 4, "alpha": 8})  # what a stage's `lora:` block does
    targets = {
        n.split(".lora_A")[0].split(".")[-1] for n, _ in peft_model.named_parameters() if "lora_A" in n
    }
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= targets
    with torch.no_grad():  # LoRA B starts at zero; make the adapter change the output
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    adapted = _logits(peft_model, ids)
    assert not torch.allclose(adapted, base, atol=1e-3)
    save_trained(peft_model, tokenizer, tmp_path / "merged")  # merges because it has an adapter
    merged = load_model(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, ids), adapted, atol=1e-4, rtol=1e-4)


def test_missing_local_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_unreachable_hub_id_is_a_one_line_error():
    with pytest.raises(ModelNotFoundError) as err:
        load_model("some-org/some-model-that-is-not-here")
    message = str(err.value)
    assert "some-org/some-model-that-is-not-here" in message and "local path" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("saved", "loaded"),
    [(torch.float64, torch.float64), (torch.float32, torch.float32), (torch.bfloat16, torch.float32)],
)
def test_a_model_loads_on_cpu_in_fp32_unless_it_was_saved_in_float64(
    nano, tokenizer, tmp_path, saved, loaded
):
    """A float64 checkpoint (the pinned recipes' start) is not downcast; bf16 on a CPU is."""
    save_model(nano.to(saved), tokenizer, tmp_path / "m")
    again = load_model(tmp_path / "m", torch.device("cpu"))
    assert {p.dtype for p in again.parameters()} == {loaded}
    assert load_model(tmp_path / "m", torch.device("cpu"), torch.bfloat16).dtype == torch.bfloat16
