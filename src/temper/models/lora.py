"""LoRA through PEFT. Defaults follow "LoRA Without Regret" (Thinking Machines, 2025):
adapt all linear layers including the MLP, and use a learning rate ~10x full fine-tuning."""

from __future__ import annotations

from pathlib import Path

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from temper.models.loading import save_model


def apply_lora(
    model: PreTrainedModel,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
) -> PeftModel:
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def merge_and_save(model: PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Fold the adapter into the base weights and save a plain model any Auto class loads."""
    merged = model.merge_and_unload()
    return save_model(merged, tokenizer, out_dir)
