from temper.models.chat import ChatOptions, ChatTemplateError, apply_chat_options, require_chat_template
from temper.models.loading import (
    ModelNotFoundError,
    adapter_base,
    default_device,
    default_dtype,
    is_adapter_dir,
    load_model,
    load_tokenizer,
    save_model,
)
from temper.models.lora import apply_lora, merge_and_save, save_adapter, save_trained, with_lora
from temper.models.presets import PRESETS, build_preset
from temper.models.tokenizer import build_tokenizer

__all__ = [
    "PRESETS",
    "ChatOptions",
    "ChatTemplateError",
    "ModelNotFoundError",
    "adapter_base",
    "apply_chat_options",
    "apply_lora",
    "build_preset",
    "build_tokenizer",
    "default_device",
    "default_dtype",
    "is_adapter_dir",
    "load_model",
    "load_tokenizer",
    "merge_and_save",
    "require_chat_template",
    "save_adapter",
    "save_model",
    "save_trained",
    "with_lora",
]
