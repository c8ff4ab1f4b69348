"""The KTO stage (Ethayarajh et al. 2024): completions labelled desirable or undesirable.

Paired data is unpaired first (chosen: desirable, rejected: undesirable), as TRL does. The
reference point z0 is estimated per batch from mismatched (prompt, completion) pairs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from temper.data.preferences import tokenize_labelled, unpair
from temper.stages.base import Loc, StageKind, length, raise_located
from temper.stages.preference import PreferenceStage, run_preference, tasks_of
from temper.train.preference import KTO, kto_items


class KTOStage(PreferenceStage):
    kind: Literal["kto"]
    name: str = "kto"
    desirable_weight: float = Field(1.0, gt=0)
    """Weight of desirable completions' losses (w_D)."""
    undesirable_weight: float = Field(1.0, gt=0)
    """Weight of undesirable completions' losses (w_U); the KTO paper keeps w_D n_D / (w_U n_U) in [1, 4/3]."""

    @model_validator(mode="after")
    def _check(self) -> KTOStage:
        errors: list[tuple[Loc, str]] = []
        if self.train.batch_size < 2:
            errors.append(
                (
                    ("train", "batch_size"),
                    "must be at least 2: KTO estimates its reference point from mismatched pairs of the batch",
                )
            )
        raise_located(errors)
        return self


def build(tokenizer, rows, max_len: int):
    tokenized, stats = tokenize_labelled(tokenizer, unpair(rows), max_len)
    return (kto_items(tokenized) if tokenized else []), stats


def run(stage: KTOStage, job) -> Any:
    method = KTO(stage.beta, stage.desirable_weight, stage.undesirable_weight)
    return run_preference(stage, "kto", job.ctx, job.source, job.out, build, method)


def describe(stage: KTOStage, recipe: Any) -> str:
    gen = stage.data.generate
    data = [f"{'labelled answers' if gen.unpaired else 'pairs'} from {gen.tasks}"] if gen else []
    lora = f", LoRA r={stage.lora.r}" if stage.lora else ""
    weights = f"w_D {stage.desirable_weight}, w_U {stage.undesirable_weight}"
    return f"kto (beta {stage.beta}, {weights}) on {data + stage.data.files}, {length(stage.train)}{lora}"


KIND = StageKind(
    name="kto",
    spec=KTOStage,
    run=run,
    describe=describe,
    reads="model",
    produces_model=True,
    help="KTO on completions labelled desirable / undesirable (or unpaired preference pairs)",
    outputs=("kto.json", "pairs.jsonl"),
    tasks=tasks_of,
    order=26,
)
