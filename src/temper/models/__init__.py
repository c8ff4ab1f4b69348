from temper.models.loading import (
    ModelNotFoundError,
    default_device,
    default_dtype,
    load_model,
    load_tokenizer,
    save_model,
)
from temper.models.lora import apply_lora, merge_and_save, save_trained, with_lora
from temper.models.presets import PRESETS, build_preset
from temper.models.tokenizer import build_tokenizer

__all__ = [
    "PRESETS",
    "ModelNotFoundError",
    "apply_lora",
    "build_preset",
    "build_tokenizer",
    "default_device",
    "default_dtype",
    "load_model",
    "load_tokenizer",
    "merge_and_save",
    "save_model",
    "save_trained",
    "with_lora",
]
