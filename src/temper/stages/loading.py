"""How the stages that render chats (sft, rl, eval) load the model they start from: the recipe's
`model.chat_template` / `model.eos_token` applied, the template required where it is used, and an
adapter folder refused where only a whole model will do (vLLM)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from temper.models import (
    apply_chat_options,
    is_adapter_dir,
    load_model,
    load_tokenizer,
    require_chat_template,
)
from temper.models.chat import eos_ids, template_warning
from temper.stages.base import StageError
from temper.stages.context import StageContext

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

console = Console(stderr=True)


def load_chat_tokenizer(
    source: Path | str, ctx: StageContext, model: PreTrainedModel | None = None, need_template: bool = True
) -> PreTrainedTokenizerBase:
    """`source`'s tokenizer with the chat options applied (and `model`'s generation config synced),
    warning when the template ends turns with a token generation does not stop at."""
    tokenizer = load_tokenizer(source)
    apply_chat_options(model, tokenizer, ctx.chat, ctx.base_dir)
    if need_template:
        require_chat_template(tokenizer, source)
    if getattr(tokenizer, "chat_template", None):
        warning = template_warning(tokenizer, eos_ids(model, tokenizer))
        if warning:
            console.print(f"[yellow]warning[/]: {source}: {warning}")
    return tokenizer


def load_chat_model(
    source: Path | str, ctx: StageContext, need_template: bool = True
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """(tokenizer, model) of `source` (a model folder, an adapter folder or a hub id), ready to chat."""
    model = load_model(source)
    return load_chat_tokenizer(source, ctx, model, need_template), model


def whole_model(source: Path | str, why: str) -> Path | str:
    """`source` if it is a whole model; an adapter folder is refused, naming `why` it must not be."""
    if is_adapter_dir(source):
        raise StageError(
            f"{source} is a LoRA adapter folder, and {why} needs a whole model: use sampler: hf, "
            "or save the earlier stage with lora.save: merged"
        )
    return source
