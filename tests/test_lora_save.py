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


def _trained_adapter(base):
    """A LoRA model on `base` whose adapter changes the logits (PEFT starts lora_B at zero)."""
    model = with_lora(load_model(base), {"r": 4, "alpha": 8})
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model


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
    train: {{max_steps: 1, warmup_steps: 0, batch_size: 2, lr: 0.01, progress: false}}
  - kind: eval
    n_problems: 2
    k: 1
    max_new_tokens: 4
    splits: [test]
"""


def _write_recipe(tmp_path, base, save="adapter"):
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
    text = RECIPE.format(base=base, save=save)
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
