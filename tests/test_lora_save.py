"""lora.save: adapter: a PEFT adapter folder that PeftModel loads with the merged model's logits,
and that later stages (and `temper eval --model DIR`) take as their model."""

import json
import shutil

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from temper.cli import main
from temper.models import (
    adapter_base,
    is_adapter_dir,
    load_model,
    load_tokenizer,
    save_model,
    save_trained,
    with_lora,
)
from temper.recipe import parse_recipe
from temper.runner import run_recipe
from tiny_qwen import IM_END, build_model, build_tokenizer

IDS = [5, 17, 42, 99, 3, 250]


def _logits(model):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits


@pytest.fixture
def base(tmp_path):
    tokenizer = build_tokenizer()
    return save_model(build_model(tokenizer), tokenizer, tmp_path / "base")


def _trained_adapter(base, seed=0):
    """A LoRA model on `base` whose adapter changes the logits (PEFT starts lora_B at zero)."""
    model = with_lora(load_model(base), {"r": 4, "alpha": 8})
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model


def _peft_load(adapter):
    """The adapter the way PEFT's users load it: its recorded base, then the adapter."""
    recorded = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(recorded), adapter)


@pytest.mark.parametrize("depth", [2, 3])
def test_an_adapter_trained_on_an_adapter_reloads_the_whole_chain(base, tmp_path, depth):
    """An adapter on an adapter folder (`save: adapter` at SFT and at RL) recorded the first one's
    base, and both PEFT and temper reloaded it without the first adapter; now the merged model it
    was trained on is saved in it (`base/`) and named, so both give the model that was trained."""
    tokenizer = load_tokenizer(base)
    source = base
    for level in range(depth):
        model = _trained_adapter(source, seed=level)
        trained = _logits(model)
        source = save_trained(model, tokenizer, tmp_path / f"adapter{level}", lora_save="adapter")
        assert torch.equal(_logits(model), trained)  # saving left the model in memory as it was
    assert is_adapter_dir(source) and adapter_base(source) == str((source / "base").resolve())
    assert not is_adapter_dir(source / "base")  # a whole model
    assert torch.allclose(_logits(_peft_load(source)), trained, rtol=0, atol=1e-6)
    assert torch.allclose(_logits(load_model(source)), trained, rtol=0, atol=1e-6)
    assert not torch.allclose(_logits(load_model(tmp_path / f"adapter{depth - 2}")), trained, atol=1e-3)
    # the folder is whole on its own: moved away from its recorded path, temper still finds its base
    moved = tmp_path / "elsewhere" / "adapter"
    shutil.copytree(source, moved)
    shutil.rmtree(source)
    assert torch.allclose(_logits(load_model(moved)), trained, rtol=0, atol=1e-6)


@pytest.mark.parametrize("save", ["full", "merged"])
def test_a_whole_model_trained_on_an_adapter_keeps_both(base, tmp_path, save):
    """adapter -> full fine-tune, and adapter -> LoRA saved merged: a plain model with both."""
    tokenizer = load_tokenizer(base)
    sft = save_trained(_trained_adapter(base), tokenizer, tmp_path / "sft", lora_save="adapter")
    if save == "merged":
        model = _trained_adapter(sft, seed=1)
    else:
        model = load_model(sft)
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(1)
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
    trained = _logits(model)
    out = save_trained(model, tokenizer, tmp_path / "rl")
    assert not is_adapter_dir(out)
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(out)), trained, rtol=0, atol=1e-6)
    assert torch.allclose(_logits(load_model(out)), trained, rtol=0, atol=1e-6)
    assert not torch.allclose(_logits(load_model(sft)), trained, atol=1e-3)


def test_adapter_save_loads_in_peft_with_the_merged_models_logits(base, tmp_path):
    tokenizer = load_tokenizer(base)
    model = _trained_adapter(base)
    adapted = _logits(model)
    assert not torch.allclose(adapted, _logits(load_model(base)), atol=1e-3)  # the adapter matters
    out = save_trained(model, tokenizer, tmp_path / "adapter", lora_save="adapter")
    files = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert "config.json" not in files and "model.safetensors" not in files
    assert is_adapter_dir(out)
    merged_dir = save_trained(model, tokenizer, tmp_path / "merged")  # the default: merged
    assert not is_adapter_dir(merged_dir)
    merged = _logits(AutoModelForCausalLM.from_pretrained(merged_dir))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out)
    assert torch.allclose(_logits(peft), merged, atol=1e-5)
    assert torch.allclose(merged, adapted, atol=1e-5)
    assert torch.allclose(_logits(load_model(out)), merged, atol=1e-5)  # temper loads it merged
    assert load_tokenizer(out)("12+34")["input_ids"] == tokenizer("12+34")["input_ids"]


def test_adapter_records_its_base_as_an_absolute_path(base, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = with_lora(load_model("base"), {"r": 2})  # loaded through a relative path
    save_trained(model, load_tokenizer("base"), "adapter", lora_save="adapter")
    recorded = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ]
    assert recorded == str(base.resolve())
    monkeypatch.chdir(tmp_path.parent)  # another working directory: still loads
    assert adapter_base(tmp_path / "adapter") == str(base.resolve())
    # a run folder moved with its base inside: the base is found relative to the adapter
    moved = tmp_path / "moved"
    shutil.copytree(base, moved / "base")
    shutil.copytree(tmp_path / "adapter", moved / "run" / "adapter")
    config = moved / "run" / "adapter" / "adapter_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"base_model_name_or_path": "../../base"}))
    assert adapter_base(moved / "run" / "adapter") == str((moved / "base").resolve())
    config.write_text(json.dumps(json.loads(config.read_text()) | {"base_model_name_or_path": "./gone"}))
    from temper.models import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="was trained on './gone', which does not exist"):
        load_model(moved / "run" / "adapter")


RECIPE = """
name: adapters
model: {{path: {base}, chat_template: chatml, eos_token: "<|im_end|>"}}
tasks: {{arithmetic: {{}}}}
stages:
  - kind: sft
    name: sft
    data: {{files: [chat.jsonl], eval_problems: 0}}
    max_len: 64
    train: {{max_steps: 2, warmup_steps: 0, batch_size: 2, lr: 0.01, progress: false}}
    lora: {{r: 4, alpha: 8, save: {save}}}
  - kind: sft
    name: again
    data: {{files: [chat.jsonl], eval_problems: 0}}
    max_len: 64
    train: {{max_steps: 1, warmup_steps: 0, batch_size: 2, lr: 0.01, progress: false}}{again}
  - kind: eval
    n_problems: 2
    k: 1
    max_new_tokens: 4
    splits: [test]
"""


def _write_recipe(tmp_path, base, save="adapter", again=""):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i}+1?"},
                {"role": "assistant", "content": f"{i + 1}"},
            ]
        }
        for i in range(6)
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = RECIPE.format(base=base, save=save, again=again and f"\n    lora: {again}")
    (tmp_path / "recipe.yaml").write_text(text)
    return text


def test_a_recipe_continues_from_an_adapter_stage_and_reruns_only_what_changed(base, tmp_path, capsys):
    text = _write_recipe(tmp_path, base)
    run = tmp_path / "run"
    run_recipe(parse_recipe(text), tmp_path, run, text)
    sft, again = run / "01-sft" / "model", run / "02-again" / "model"
    assert is_adapter_dir(sft) and not is_adapter_dir(again)
    assert load_tokenizer(sft).eos_token == IM_END  # the chat options are saved with the adapter
    assert json.loads((sft / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    # what the second stage started from: the base with the adapter merged in, not the bare base
    merged = _logits(load_model(sft))
    assert not torch.allclose(merged, _logits(load_model(base)), atol=1e-4)
    results = json.loads((run / "03-eval" / "eval.json").read_text())["arithmetic"]
    assert set(results) == {str(base), "sft", "again"}  # the starting model is always evaluated first
    hashes = {d.parent.name: json.loads(d.read_text())["hash"] for d in run.glob("*/stage.json")}
    assert len(hashes) == 3

    capsys.readouterr()
    run_recipe(parse_recipe(text), tmp_path, run, text)  # same settings: every stage is skipped
    assert capsys.readouterr().err.count("complete, skipped") == 3

    merged_text = _write_recipe(tmp_path, base, save="merged")
    run_recipe(parse_recipe(merged_text), tmp_path, run, merged_text)
    assert not is_adapter_dir(run / "01-sft" / "model")
    assert all(
        json.loads((run / name / "stage.json").read_text())["hash"] != digest
        for name, digest in hashes.items()
    )


def test_stage_commands_take_an_adapter_folder_as_their_model(base, tmp_path, capsys):
    _write_recipe(tmp_path, base)
    flags = ["--model.chat_template", "chatml", "--model.eos_token", IM_END]
    sft = [
        "sft",
        *("--model", str(base), "--out", str(tmp_path / "sft")),
        *("--data.files", str(tmp_path / "chat.jsonl"), "--data.eval_problems", "0", "--max_len", "64"),
        *("--train.max_steps", "1", "--train.warmup_steps", "0", "--train.batch_size", "2"),
        *("--train.progress", "false", "--lora.save", "adapter", "--lora.r", "4"),
    ]
    assert main([*sft, *flags]) == 0
    adapter = tmp_path / "sft" / "model"
    assert is_adapter_dir(adapter)
    evaluate = ["eval", "--model", str(adapter), "--out", str(tmp_path / "eval"), "--tasks", "arithmetic"]
    evaluate += ["--splits", "test", "--n_problems", "2", "--k", "1", "--max_new_tokens", "3"]
    assert main(evaluate) == 0
    assert "arithmetic / sft" in capsys.readouterr().out
    assert main([*evaluate, "--sampler", "vllm", "--overwrite"]) == 2  # vLLM needs a whole model: refused
    assert "is a LoRA adapter folder, and sampler: vllm needs a whole model" in capsys.readouterr().err


def test_a_recipe_with_two_adapter_stages_saves_what_the_second_trained(base, tmp_path, monkeypatch):
    """`save: adapter` at both stages: the second adapter, loaded by PEFT from its recorded base and
    by temper (as its eval does), has the logits of the model the stage held when it saved."""
    import temper.stages.sft as sft_stage

    held = {}

    def save_trained_and_keep(model, tokenizer, out, save="merged"):
        held[out.parent.name] = _logits(model)
        return save_trained(model, tokenizer, out, save)

    monkeypatch.setattr(sft_stage, "save_trained", save_trained_and_keep)
    text = _write_recipe(tmp_path, base, again="{r: 4, alpha: 8, save: adapter}")
    run = tmp_path / "run"
    run_recipe(parse_recipe(text), tmp_path, run, text)
    sft, again = run / "01-sft" / "model", run / "02-again" / "model"
    assert is_adapter_dir(sft) and is_adapter_dir(again)
    trained = held["02-again"]
    assert torch.allclose(_logits(_peft_load(again)), trained, rtol=0, atol=1e-6)
    assert torch.allclose(_logits(load_model(again)), trained, rtol=0, atol=1e-6)
    # the bug: the second adapter on the first's base, the first stage's training gone
    alone = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), again)
    assert not torch.allclose(_logits(alone), trained, atol=1e-3)
