"""The SFT stage: chat demonstrations (from tasks and/or TRL-format data sets) with assistant-only loss.

Data sets are read by `temper.data.sources` (JSONL, JSON arrays, parquet, arrow, `save_to_disk`
folders, hub ids), so every format gives the same examples and the same row errors.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json
from temper.data.dataset import build_sequences, require_sequences
from temper.data.formats import Example, load_rows
from temper.data.mask_view import mask_views
from temper.models import require_chat_template, save_trained, with_lora
from temper.stages.base import (
    LoraSpec,
    StageKind,
    Strict,
    epoch_steps,
    epochs_rule,
    lazy,
    length,
    raise_located,
    train_rules,
)
from temper.stages.context import StageContext
from temper.stages.loading import load_chat_model
from temper.stages.preference import GenerateSpec, generated_rows
from temper.train.supervised import TrainConfig, train_supervised

console = Console(stderr=True)


class SFTData(Strict):
    tasks: list[str] = []
    """Tasks whose train-split demonstrations become chat examples."""
    problems_per_task: int | dict[str, int] = 2_000
    """Train-split demonstrations per task: one number for all, or {task: number}."""
    files: list[str] = []
    """Data sets in TRL formats (messages, or prompt/completion): .jsonl, .json, .parquet or .arrow
    files, save_to_disk folders, or hub ids; `NAME[split]` picks a split (default train)."""
    eval_files: list[str] = []
    """Held-out data sets (same forms) for the eval loss, beside the tasks' test demonstrations."""
    skip_bad_rows: bool = False
    eval_problems: int = Field(64, ge=0)
    """Test-split demonstrations per task for the eval loss."""
    seed: int = 1
    # left out of the settings (and so of the stage hash) when unset, so SFT stages written before
    # this field existed keep their hash and their finished folders
    pairs: GenerateSpec | None = Field(None, exclude_if=lambda v: v is None)
    """SFT on the chosen answers of preference pairs generated from tasks by the starting model,
    the block of a dpo stage's `data.generate` (the same block and source give the same pairs:
    the SFT-on-chosen baseline of DPO); held-out: the chosen answers of its eval_prompts' pairs."""


class SFTStage(Strict):
    kind: Literal["sft"]
    name: str = "sft"
    data: SFTData = SFTData()
    max_len: int = Field(256, gt=1)
    pack: bool = False
    train: TrainConfig = TrainConfig()
    lora: LoraSpec | None = None
    """Train a PEFT LoRA adapter; saved merged into the model unless lora.save: adapter."""
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data: Any) -> Any:
        return epochs_rule(data)

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
        if self.data.pairs and self.data.pairs.unpaired:
            errors.append((("data", "pairs", "unpaired"), "SFT trains on the chosen answers of pairs"))
        raise_located(errors)
        return self


def demonstrations(
    ctx: StageContext, tasks: list[str], split: str, n: int | dict[str, int], seed: int
) -> list[Example]:
    """One chat example per problem: the task's prompt and its demonstration, or the whole
    conversation of a task with `demonstration_messages` (an environment's episode)."""
    out = []
    for name in tasks:
        task = ctx.tasks[name]
        count = n.get(name, 0) if isinstance(n, dict) else n
        for i, problem in enumerate(task.sample(split, count, seed)):
            if hasattr(task, "demonstration_messages"):  # a multi-turn episode: every move trained
                messages = task.demonstration_messages(problem)
            else:
                messages = problem.messages() + [
                    {"role": "assistant", "content": task.demonstration(problem)}
                ]
            spans = tuple(task.environment_spans(problem)) if hasattr(task, "environment_spans") else ()
            tools = getattr(task, "tools", None)  # the schemas an env task's prompts show (multi_tool)
            out.append(
                Example(
                    source=f"task:{name}:{split}", line=i + 1, messages=messages, untrained=spans, tools=tools
                )
            )
    return out


def file_examples(
    specs: list[str], ctx: StageContext, skip_bad_rows: bool, skipped: dict[str, int]
) -> list[Example]:
    """The validated rows of data sets (paths relative to the recipe's folder), counting skipped
    rows per data set into `skipped`."""
    out: list[Example] = []
    for spec in specs:
        rows, report = load_rows(spec, ctx.base_dir, skip_bad_rows=skip_bad_rows)
        out += rows
        if report.skipped:
            skipped[spec] = report.skipped
            console.print(
                f"[yellow]sft[/]: skipped {report.skipped} bad rows of {spec}; first: {report.errors[0]}"
            )
    return out


def sft_examples(stage: SFTStage, ctx: StageContext) -> tuple[list[Example], list[Example], dict]:
    data = stage.data
    train = demonstrations(ctx, data.tasks, "train", data.problems_per_task, data.seed)
    skipped: dict[str, int] = {}
    train += file_examples(data.files, ctx, data.skip_bad_rows, skipped)
    random.Random(data.seed).shuffle(train)
    held_out = (
        demonstrations(ctx, data.tasks, "test", data.eval_problems, data.seed) if data.eval_problems else []
    )
    held_out += file_examples(data.eval_files, ctx, data.skip_bad_rows, skipped)
    return train, held_out, skipped


def chosen_examples(pairs: list) -> list[Example]:
    """Each preference pair's prompt and chosen answer as an SFT example."""
    return [Example(p.source, p.line, prompt=p.prompt, completion=p.chosen, tools=p.tools) for p in pairs]


def run_sft(stage: SFTStage, ctx: StageContext, source: Path, out: Path) -> Path:
    tokenizer, model = load_chat_model(source, ctx, need_template=False)
    train_rows, eval_rows, skipped = sft_examples(stage, ctx)
    generated = {}
    if stage.data.pairs:  # the starting model answers first, then trains on its chosen answers
        pairs, held_out, counts = generated_rows(stage.data.pairs, ctx, model, tokenizer, out)
        train_rows += chosen_examples(pairs)
        random.Random(stage.data.seed).shuffle(train_rows)
        eval_rows += chosen_examples(held_out)
        generated = {"generated": counts}
    if any(e.messages is not None or isinstance(e.prompt, list) for e in train_rows + eval_rows):
        require_chat_template(tokenizer, source)  # plain prompt/completion and text rows need none
    train, stats = build_sequences(tokenizer, train_rows, stage.max_len, pack=stage.pack)
    sources = [f"task:{t}" for t in tasks_of(stage)] + stage.data.files
    require_sequences(train, stats, sources, sum(skipped.values()), stage.max_len)
    eval_set, _ = build_sequences(tokenizer, eval_rows, stage.max_len) if eval_rows else ([], None)
    if distributed.is_main():  # the first example of each source with its loss mask, for the report
        atomic_write_json(out / "examples.json", mask_views(tokenizer, train_rows, stage.max_len))
    console.print(
        f"sft: {stats.examples} examples ({stats.truncated} truncated, {stats.dropped} dropped), "
        f"{stats.supervised_tokens} supervised tokens, {len(eval_set)} held-out"
    )
    config = epoch_steps(stage.train, len(train), "sft")
    model = with_lora(model, stage.lora and stage.lora.adapter_args())
    result = train_supervised(model, train, config, out, pad_id=tokenizer.pad_token_id, eval_set=eval_set)
    model_dir = save_trained(model, tokenizer, out / "model", stage.lora.save if stage.lora else "merged")
    if distributed.is_main():
        atomic_write_json(
            out / "sft.json",
            {
                "data": stats.as_dict(),
                "skipped_rows": skipped,
                "steps": result.steps,
                "epochs": stage.train.epochs,
                "final_loss": result.final_loss,
                "eval_loss": result.eval_loss,
                "seconds": result.seconds,
                "tokens": result.tokens,
                "precision": result.precision,
            }
            | generated,
        )
    return model_dir


def tasks_of(stage: SFTStage) -> list[str]:
    """The tasks the stage reads: its demonstrations' and its generated pairs'."""
    pairs = stage.data.pairs.tasks if stage.data.pairs else []
    return stage.data.tasks + [t for t in pairs if t not in stage.data.tasks]


def describe(stage: SFTStage, recipe: Any) -> str:
    lora = f", LoRA r={stage.lora.r}" if stage.lora else ""
    held_out = f", eval loss on {stage.data.eval_files}" if stage.data.eval_files else ""
    chosen = [f"chosen answers of pairs from {stage.data.pairs.tasks}"] if stage.data.pairs else []
    return f"sft on {stage.data.tasks + chosen + stage.data.files}, {length(stage.train)}{lora}{held_out}"


KIND = StageKind(
    name="sft",
    spec=SFTStage,
    run=lambda stage, job: run_sft(stage, job.ctx, job.source, job.out),
    describe=describe,
    reads="model",
    produces_model=True,
    help="supervised fine-tuning on task demonstrations and/or data sets (JSONL, parquet, datasets)",
    section=lazy("temper.report.training", "training_section"),
    outputs=("sft.json",),
    tasks=lambda stage: tasks_of(stage),
    order=20,
)
