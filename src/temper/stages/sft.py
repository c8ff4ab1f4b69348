"""The SFT stage: chat demonstrations (from tasks and/or TRL-format files) with assistant-only loss."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json
from temper.data.dataset import build_sequences, require_sequences
from temper.data.formats import Example, load_jsonl
from temper.data.mask_view import mask_views
from temper.models import load_model, load_tokenizer, save_trained, with_lora
from temper.stages.base import LoraSpec, StageKind, Strict, lazy, raise_located, train_rules
from temper.stages.context import StageContext
from temper.train.supervised import TrainConfig, train_supervised

console = Console(stderr=True)


class SFTData(Strict):
    tasks: list[str] = []
    """Tasks whose train-split demonstrations become chat examples."""
    problems_per_task: int | dict[str, int] = 2_000
    """Train-split demonstrations per task: one number for all, or {task: number}."""
    files: list[str] = []
    """JSONL files in TRL formats (messages, or prompt/completion)."""
    skip_bad_rows: bool = False
    eval_problems: int = Field(64, ge=0)
    """Test-split demonstrations per task for the eval loss."""
    seed: int = 1


class SFTStage(Strict):
    kind: Literal["sft"]
    name: str = "sft"
    data: SFTData = SFTData()
    max_len: int = Field(256, gt=1)
    pack: bool = False
    train: TrainConfig = TrainConfig()
    lora: LoraSpec | None = None
    """Train a PEFT LoRA adapter and merge it into the saved model."""
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""

    @model_validator(mode="after")
    def _check(self) -> SFTStage:
        errors = [(("train", *loc), msg) for loc, msg in train_rules(self.train)]
        counts = self.data.problems_per_task
        # checked here, not as `Annotated` ranges: a range inside the union would report the
        # error once per union member, under pydantic's member names
        per_task = [((k,), n) for k, n in counts.items()] if isinstance(counts, dict) else [((), counts)]
        errors += [
            (("data", "problems_per_task", *k), f"must be at least 0, got {n}") for k, n in per_task if n < 0
        ]
        raise_located(errors)
        return self


def demonstrations(
    ctx: StageContext, tasks: list[str], split: str, n: int | dict[str, int], seed: int
) -> list[Example]:
    """One single-turn chat example per problem: the task's prompt and its demonstration."""
    out = []
    for name in tasks:
        task = ctx.tasks[name]
        count = n.get(name, 0) if isinstance(n, dict) else n
        for i, problem in enumerate(task.sample(split, count, seed)):
            messages = problem.messages() + [{"role": "assistant", "content": task.demonstration(problem)}]
            out.append(Example(source=f"task:{name}:{split}", line=i + 1, messages=messages))
    return out


def sft_examples(stage: SFTStage, ctx: StageContext) -> tuple[list[Example], list[Example], dict]:
    data = stage.data
    train = demonstrations(ctx, data.tasks, "train", data.problems_per_task, data.seed)
    skipped: dict[str, int] = {}
    for path in data.files:
        rows, report = load_jsonl(ctx.resolve(path), skip_bad_rows=data.skip_bad_rows)
        train += rows
        if report.skipped:
            skipped[path] = report.skipped
            console.print(
                f"[yellow]sft[/]: skipped {report.skipped} bad rows of {path}; first: {report.errors[0]}"
            )
    random.Random(data.seed).shuffle(train)
    held_out = (
        demonstrations(ctx, data.tasks, "test", data.eval_problems, data.seed) if data.eval_problems else []
    )
    return train, held_out, skipped


def run_sft(stage: SFTStage, ctx: StageContext, source: Path, out: Path) -> Path:
    tokenizer, model = load_tokenizer(source), load_model(source)
    train_rows, eval_rows, skipped = sft_examples(stage, ctx)
    train, stats = build_sequences(tokenizer, train_rows, stage.max_len, pack=stage.pack)
    sources = [f"task:{t}" for t in stage.data.tasks] + stage.data.files
    require_sequences(train, stats, sources, sum(skipped.values()), stage.max_len)
    eval_set, _ = build_sequences(tokenizer, eval_rows, stage.max_len) if eval_rows else ([], None)
    if distributed.is_main():  # the first example of each source with its loss mask, for the report
        atomic_write_json(out / "examples.json", mask_views(tokenizer, train_rows, stage.max_len))
    console.print(
        f"sft: {stats.examples} examples ({stats.truncated} truncated, {stats.dropped} dropped), "
        f"{stats.supervised_tokens} supervised tokens, {len(eval_set)} held-out"
    )
    model = with_lora(model, stage.lora and stage.lora.model_dump())
    result = train_supervised(
        model, train, stage.train, out, pad_id=tokenizer.pad_token_id, eval_set=eval_set
    )
    model_dir = save_trained(model, tokenizer, out / "model")
    if distributed.is_main():
        atomic_write_json(
            out / "sft.json",
            {
                "data": stats.as_dict(),
                "skipped_rows": skipped,
                "steps": result.steps,
                "final_loss": result.final_loss,
                "eval_loss": result.eval_loss,
                "seconds": result.seconds,
                "tokens": result.tokens,
                "precision": result.precision,
            },
        )
    return model_dir


def describe(stage: SFTStage, recipe: Any) -> str:
    lora = f", LoRA r={stage.lora.r}" if stage.lora else ""
    return f"sft on {stage.data.tasks + stage.data.files}, {stage.train.max_steps} steps{lora}"


KIND = StageKind(
    name="sft",
    spec=SFTStage,
    run=lambda stage, job: run_sft(stage, job.ctx, job.source, job.out),
    describe=describe,
    reads="model",
    produces_model=True,
    help="supervised fine-tuning on task demonstrations and/or JSONL files",
    section=lazy("temper.report.training", "training_section"),
    outputs=("sft.json",),
    tasks=lambda stage: stage.data.tasks,
    order=20,
)
