"""The DPO stage: sigmoid DPO (Rafailov et al. 2023), cDPO label smoothing or IPO, on preference pairs.

The reference is the starting model (the source stage's), or with `lora` the same model with the
adapter disabled; its logprobs are computed once before the first step (`temper.train.preference`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from temper.data.formats import DataError
from temper.data.preferences import Pair, tokenize_pairs
from temper.stages.base import StageKind, length, raise_located
from temper.stages.preference import PreferenceStage, run_preference, tasks_of
from temper.train.preference import DPO


class DPOStage(PreferenceStage):
    kind: Literal["dpo"]
    name: str = "dpo"
    loss: Literal["sigmoid", "ipo"] = "sigmoid"
    """sigmoid: DPO's -log sigma(beta h); ipo: IPO's (h / |y| - 1 / (2 beta))^2 on per-token log-ratios."""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """cDPO: the assumed probability that a pair's label is flipped (sigmoid loss only)."""

    @model_validator(mode="after")
    def _check(self) -> DPOStage:
        errors = []
        if self.loss == "ipo" and self.label_smoothing:
            errors.append(
                (("label_smoothing",), "applies to loss: sigmoid (cDPO) only; IPO has no label smoothing")
            )
        if self.data.generate and self.data.generate.unpaired:
            errors.append(
                (
                    ("data", "generate", "unpaired"),
                    "DPO trains on pairs; unpaired (labelled) answers are for kind: kto",
                )
            )
        raise_located(errors)
        return self


def build(tokenizer, rows, max_len: int):
    unpaired = [r for r in rows if not isinstance(r, Pair)]
    if unpaired:
        r = unpaired[0]
        raise DataError(
            r.source,
            r.line,
            "label",
            "an unpaired (prompt/completion/label) row: DPO needs chosen/rejected pairs; train unpaired data with kind: kto",
        )
    return tokenize_pairs(tokenizer, rows, max_len)


def run(stage: DPOStage, job) -> Any:
    method = DPO(beta=stage.beta, loss_type=stage.loss, label_smoothing=stage.label_smoothing)
    return run_preference(stage, "dpo", job.ctx, job.source, job.out, build, method)


def describe(stage: DPOStage, recipe: Any) -> str:
    data = [f"pairs from {stage.data.generate.tasks}"] if stage.data.generate else []
    smooth = f", label smoothing {stage.label_smoothing}" if stage.label_smoothing else ""
    lora = f", LoRA r={stage.lora.r}" if stage.lora else ""
    return f"dpo ({stage.loss}, beta {stage.beta}{smooth}) on {data + stage.data.files}, {length(stage.train)}{lora}"


KIND = StageKind(
    name="dpo",
    spec=DPOStage,
    run=run,
    describe=describe,
    reads="model",
    produces_model=True,
    help="DPO / IPO on preference pairs (TRL formats, or generated from tasks with the verifier)",
    outputs=("dpo.json", "pairs.jsonl"),
    tasks=tasks_of,
    order=25,
)
