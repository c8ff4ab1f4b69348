"""LoRA through PEFT. Defaults follow "LoRA Without Regret" (Thinking Machines, 2025):
adapt all linear layers including the MLP, and use a learning rate ~10x full fine-tuning."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from temper.models.loading import STACKED_BASE, is_adapter_dir, save_model

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def apply_lora(
    model: PreTrainedModel,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    task_type: str = "CAUSAL_LM",
) -> PeftModel:
    """`model` under a new adapter. `task_type="SEQ_CLS"` for a sequence classifier (a reward
    model): PEFT then trains its head (`score` / `classifier`) in full (`modules_to_save`)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type=task_type,
    )
    return get_peft_model(model, config)


def with_lora(model: PreTrainedModel, lora: Mapping[str, Any] | None) -> PreTrainedModel | PeftModel:
    """`model` under a new LoRA adapter with `apply_lora`'s arguments `lora`, or unchanged for None."""
    return apply_lora(model, **lora) if lora else model


LoraSave = Literal["merged", "adapter"]


def save_trained(
    model: PreTrainedModel | PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    lora_save: LoraSave = "merged",
) -> Path:
    """Save a trained model. A LoRA model is saved as `lora_save` says: "merged" (the adapter
    folded into the base: a plain model any Auto class loads) or "adapter" (a PEFT adapter folder,
    tokenizer beside it, that `PeftModel.from_pretrained(base, out_dir)` loads, and that every
    temper stage accepts as its model)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        if lora_save == "adapter":
            return save_adapter(model, tokenizer, out_dir)
        return merge_and_save(model, tokenizer, out_dir)
    return save_model(model, tokenizer, out_dir)


def merge_and_save(model: PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Fold the adapter into the base weights and save a plain model any Auto class loads."""
    merged = model.merge_and_unload()
    return save_model(merged, tokenizer, out_dir)


def save_adapter(model: PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save the adapter alone. Its `base_model_name_or_path` is the folder (or hub id) the base
    was loaded from, a local folder as an absolute path, so the adapter loads from any working
    directory (`temper.models.loading.adapter_base` also tries it relative to the adapter).

    An adapter trained on another adapter folder (a `save: adapter` stage after another) cannot
    name that folder as its base: transformers loads an adapter folder with its adapter unmerged,
    and PEFT's second adapter on top gives neither model. The merged model it was trained on is
    saved beside it instead, in `<out>/base` (STACKED_BASE), and named as its base, so
    `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(<out>/base), <out>)` is the
    model that was trained, and the folder is whole on its own (a full copy of the base's weights)."""
    stacked = False
    for config in model.peft_config.values():
        base = config.base_model_name_or_path or model.get_base_model().name_or_path
        local = Path(str(base)).expanduser()
        if is_adapter_dir(local):
            stacked, base = True, str(Path(out_dir).resolve() / STACKED_BASE)
        elif local.is_dir():
            base = str(local.resolve())
        config.base_model_name_or_path = base
    # the base layers hold the merged model trained on, untouched by LoRA: a copy without the adapter
    unloaded = (lambda: copy.deepcopy(model).unload()) if stacked else None
    return save_model(model, tokenizer, out_dir, stacked_base=unloaded)
