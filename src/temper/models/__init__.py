from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
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

__getattr__, __dir__ = exports(
    globals(),
    {
        "ChatOptions": "chat",
        "ChatTemplateError": "chat",
        "apply_chat_options": "chat",
        "require_chat_template": "chat",
        "ModelNotFoundError": "loading",
        "adapter_base": "loading",
        "default_device": "loading",
        "default_dtype": "loading",
        "is_adapter_dir": "loading",
        "load_model": "loading",
        "load_tokenizer": "loading",
        "save_model": "loading",
        "apply_lora": "lora",
        "merge_and_save": "lora",
        "save_adapter": "lora",
        "save_trained": "lora",
        "with_lora": "lora",
        "PRESETS": "presets",
        "build_preset": "presets",
        "build_tokenizer": "tokenizer",
    },
)

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
