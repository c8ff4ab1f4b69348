"""A frozen teacher for the distillation stages that read one by name (rft's CoT distillation,
prompt_distill): loaded after checking that it maps text to the student's token ids.

rl's `teacher:` (on-policy distillation) makes the same check with `rl.tokenizer_mismatch`; the
message here says why the stage at hand needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from temper.models import load_model, load_tokenizer
from temper.stages.base import StageError
from temper.stages.context import StageContext

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def load_frozen_teacher(
    ctx: StageContext, ref: str, tokenizer, student: Path | str, stage: str, why: str
) -> torch.nn.Module:
    """The model `ref` names (an earlier stage, a folder or a hub id), in eval mode without
    gradients, once its tokenizer gives every token the student's id; else a `StageError` naming
    the first difference, the `stage` and `why` it needs shared ids."""
    return load_model(checked_teacher(ctx, ref, tokenizer, student, stage, why)).eval().requires_grad_(False)


def checked_teacher(
    ctx: StageContext, ref: str, tokenizer, student: Path | str, stage: str, why: str
) -> Path | str:
    """Where the model `ref` names lies, once its tokenizer is checked as `load_frozen_teacher`
    says (for a sampler that loads the teacher itself, e.g. vLLM)."""
    from temper.stages.rl import tokenizer_mismatch

    if ref in ctx.stage_dirs and ref not in ctx.models:
        raise StageError(f"{stage}: teacher {ref!r} is a stage that saves no model")
    source = ctx.model_of(ref)
    if problem := tokenizer_mismatch(tokenizer, load_tokenizer(source)):
        raise StageError(
            f"{stage}: teacher {ref!r} ({source}) and the student ({student}) do not share a tokenizer: "
            f"{problem}. {why}, so both must map text to the same ids; pick a teacher of the same family"
        )
    return source
