"""The pretrain stage: a from-scratch preset (or a user model) trained on a text corpus.

The default corpus is the built-in tasks' problems with their solutions in plain notation, so
the base learns the notation and the arithmetic but not the chat protocol: SFT teaches that.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_dir, atomic_write_json
from temper.data.chat import tokenize_example
from temper.data.dataset import build_sequences
from temper.data.formats import Example, NoUsableRowsError, load_rows
from temper.data.mix import mix_examples
from temper.models import build_preset, build_tokenizer, load_model, load_tokenizer, save_model
from temper.stages.base import (
    EpochRows,
    StageKind,
    Strict,
    epoch_steps,
    epochs_rule,
    length,
    raise_located,
    train_rules,
)
from temper.stages.context import StageContext, settings_hash
from temper.train.objective import NextToken
from temper.train.supervised import TrainConfig, train_supervised

if TYPE_CHECKING:
    from temper.recipe import ModelSpec, Recipe

console = Console(stderr=True)


class MixSource(Strict):
    tasks: list[str] = []
    """Tasks whose corpus lines this source holds (as `corpus.tasks`)."""
    files: list[str] = []
    """Text files or data sets this source holds (as `corpus.files`)."""
    share: float = Field(ge=0.0, le=1.0)
    """This source's share of the mixed corpus's tokens."""


class CorpusSpec(Strict):
    tasks: list[str] = []
    """Tasks whose problems and solutions, in plain notation, make the synthetic corpus."""
    problems_per_task: int = Field(20_000, gt=0)
    chat_share: float = Field(0.0, ge=0.0, le=1.0)
    """Share of each task's corpus problems written as a whole chat (the prompt and the SFT
    demonstration through the model's chat template, `Answer:` line included) instead of plain
    notation: a base that has seen the answer format now and then, as web-trained bases have,
    which is what RL straight from the base (R1-Zero) needs to get any reward. 0: never."""
    files: list[str] = []
    """Extra text: .txt (one document per line), or any data set with a `text` column (.jsonl,
    .json, .parquet, .arrow, a save_to_disk folder, a hub id; `NAME[split]` picks a split)."""
    seed: int = 0
    mix: dict[str, MixSource] = {}
    """Named sources at token shares (continued pre-training against forgetting: `{new: {tasks:
    [arithmetic_cy], share: 0.8}, old: {tasks: [arithmetic], share: 0.2}}`), interleaved evenly
    and `tokens` long (`temper.data.mix`); what each source gave is recorded in pretrain.json.
    With a mix, the corpus's own `tasks` and `files` stay empty."""
    tokens: int | None = Field(None, gt=0)
    """A mixed corpus's length in tokens (each source repeated if it is shorter than its share)."""


class PretrainStage(Strict):
    kind: Literal["pretrain"]
    name: str = "pretrain"
    corpus: CorpusSpec = CorpusSpec()
    max_len: int = Field(128, gt=1)
    """Packed row length in tokens."""
    train: TrainConfig = TrainConfig()
    cache: str | None = None
    """Directory of a previously produced base (e.g. the one shipped in checkpoints/); used
    instead of training when its recorded settings equal this stage's, filled otherwise."""

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data: Any) -> Any:
        return epochs_rule(data)

    @model_validator(mode="after")
    def _check(self) -> PretrainStage:
        errors = [(("train", *loc), msg) for loc, msg in train_rules(self.train)]
        corpus = self.corpus
        if corpus.mix:
            if corpus.tasks or corpus.files:
                errors.append(
                    (
                        ("corpus", "mix"),
                        "with a mix, name the tasks and files in its sources, not in the corpus",
                    )
                )
            if corpus.tokens is None:
                errors.append((("corpus", "tokens"), "a mix needs tokens: the mixed corpus's length"))
            if not math.isclose(total := sum(m.share for m in corpus.mix.values()), 1.0, abs_tol=1e-6):
                errors.append((("corpus", "mix"), f"the shares must sum to 1, got {total:g}"))
            for name, source in corpus.mix.items():
                if not source.tasks and not source.files:
                    errors.append((("corpus", "mix", name), "an empty source: give tasks or files"))
        elif corpus.tokens is not None:
            errors.append((("corpus", "tokens"), "tokens sets a mix's length: give a mix, or leave it out"))
        elif not corpus.tasks and not corpus.files:
            errors.append((("corpus",), "the corpus is empty: give tasks (their problems) or files (text)"))
        raise_located(errors)
        return self


def corpus_examples(stage: PretrainStage, ctx: StageContext, tokenizer=None) -> list[Example]:
    """Task lines (train split only, so test problems never leak into the base) plus user files;
    with `corpus.chat_share`, every problem whose index falls in that share (spread evenly) is a
    chat transcript rendered by `tokenizer`'s chat template instead. A `corpus.mix`: see
    `mixed_corpus`."""
    if stage.corpus.mix:
        return mixed_corpus(stage, ctx, tokenizer)[0]
    examples = _source_examples(stage.corpus.tasks, stage.corpus.files, stage, ctx, tokenizer)
    random.Random(stage.corpus.seed).shuffle(examples)
    return examples


def mixed_corpus(stage: PretrainStage, ctx: StageContext, tokenizer) -> tuple[list[Example], dict]:
    """A `corpus.mix`'s examples, its sources interleaved at their token shares (counted as the
    packer tokenizes them), and what each source gave."""
    corpus = stage.corpus
    sources = {
        name: _source_examples(m.tasks, m.files, stage, ctx, tokenizer) if m.share else []
        for name, m in corpus.mix.items()
    }
    shares = {name: m.share for name, m in corpus.mix.items()}
    max_len = stage.max_len
    return mix_examples(
        sources,
        shares,
        corpus.tokens,
        lambda ex: len(tokenize_example(tokenizer, ex, max_len).input_ids),
        corpus.seed,
    )


def _source_examples(
    tasks: list[str], files: list[str], stage: PretrainStage, ctx: StageContext, tokenizer
) -> list[Example]:
    examples: list[Example] = []
    share = stage.corpus.chat_share
    for name in tasks:
        task = ctx.tasks[name]
        for i, problem in enumerate(task.sample("train", stage.corpus.problems_per_task, stage.corpus.seed)):
            if share and int((i + 1) * share) > int(i * share):  # e.g. 0.25: problems 3, 7, 11, ...
                chat = [*problem.messages(), {"role": "assistant", "content": task.demonstration(problem)}]
                text = tokenizer.apply_chat_template(chat, tokenize=False)
            else:
                text = task.corpus_text(problem)
            examples.append(Example(source=f"task:{name}", line=i + 1, text=text))
    for path in files:
        rows, _ = load_rows(path, ctx.base_dir)
        examples += [r for r in rows if r.text is not None] or _no_text(path, len(rows))
    return examples


def _no_text(path: str, rows: int) -> list[Example]:
    raise NoUsableRowsError(
        [path], f"{rows} rows read, none with a 'text' field (chat rows are for sft, not pretrain)"
    )


def pretrain_hash(stage: PretrainStage, spec: ModelSpec, ctx: StageContext) -> str:
    """The settings the recipe states that determine the weights (not the stage name or cache path).

    Only explicitly set values count, so a shipped base stays valid when a later version adds a
    setting with a default; the full resolved settings are recorded beside it for provenance.
    `train` is a dataclass, whose fields pydantic always counts as set: its settings that cannot
    change the weights (progress bar, trackers) are left out, and so is `precision` at fp32, the
    only precision before the setting existed (a base trained in bf16 gets its own hash), and
    `epochs` when not given (likewise)."""
    tasks = {t: ctx.task_options.get(t, {}) for t in corpus_tasks(stage)}
    skip_train = {"progress", "trackers"} | ({"precision"} if stage.train.precision == "fp32" else set())
    skip_train |= {"epochs"} if stage.train.epochs is None else set()
    defaults = TrainConfig()  # settings added later (optimizer): left out at their defaults
    skip_train |= {n for n in TrainConfig.HASHED_WHEN_SET if getattr(stage.train, n) == getattr(defaults, n)}
    settings = stage.model_dump(
        exclude_unset=True, exclude={"name": True, "cache": True, "train": skip_train}
    )
    # pretraining renders no chats: the chat options never retrain a base
    weights = spec.model_dump(exclude_unset=True, exclude={"chat_template", "eos_token"})
    return settings_hash("pretrain", weights, tasks, settings)


def run_pretrain(stage: PretrainStage, spec: ModelSpec, ctx: StageContext, out: Path) -> Path:
    digest = pretrain_hash(stage, spec, ctx)
    model_dir = out / "model"
    cache = ctx.resolve(stage.cache) if stage.cache else None
    if cache and _cache_matches(cache, digest):
        console.print(f"[green]pretrain[/]: using the base in {cache} (same settings, hash {digest})")
        if distributed.is_main():
            shutil.copytree(cache / "model", model_dir, dirs_exist_ok=True)
            for name in ("metrics.jsonl", "pretrain.json"):
                if (cache / name).exists():
                    shutil.copy(cache / name, out / name)
        distributed.wait()
        return model_dir
    if cache:
        console.print(
            f"[yellow]pretrain[/]: no base with these settings in {cache}; training one (hash {digest})"
        )

    if spec.preset:
        tokenizer = build_tokenizer()
        model = build_preset(spec.preset, tokenizer, seed=spec.seed, qk_norm=spec.qk_norm)
    else:
        path = ctx.model_source(spec.path)
        tokenizer, model = load_tokenizer(path), load_model(path)
    mix = None
    if stage.corpus.mix:
        examples, mix = mixed_corpus(stage, ctx, tokenizer)
    else:
        examples = corpus_examples(stage, ctx, tokenizer)
    sequences, stats = build_sequences(tokenizer, examples, stage.max_len, pack=True)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(
        f"pretrain: {n_params / 1e6:.2f}M parameters, {stats.sequences} packed rows, "
        f"{stats.tokens} tokens, {stats.truncated} truncated"
    )
    config = epoch_steps(stage.train, len(sequences), "pretrain")
    result = train_supervised(model, sequences, config, out, objective=NextToken(tokenizer.pad_token_id))
    save_model(model, tokenizer, model_dir)
    summary = {
        "hash": digest,
        "settings": stage.model_dump(),
        "model": spec.model_dump(),
        "parameters": n_params,
        "data": stats.as_dict(),
        "steps": result.steps,
        "final_loss": result.final_loss,
        "seconds": result.seconds,
        "tokens": result.tokens,
        "precision": result.precision,
        **({"mix": mix} if mix else {}),
    }
    if distributed.is_main():
        atomic_write_json(out / "pretrain.json", summary)
        if cache:
            _fill_cache(cache, out, summary)
    return model_dir


def _cache_matches(cache: Path, digest: str) -> bool:
    marker = cache / "pretrain.json"
    return (
        marker.exists()
        and (cache / "model").is_dir()
        and json.loads(marker.read_text()).get("hash") == digest
    )


def _fill_cache(cache: Path, out: Path, summary: dict) -> None:
    with atomic_dir(cache) as tmp:
        shutil.copytree(out / "model", tmp / "model")
        shutil.copy(out / "metrics.jsonl", tmp / "metrics.jsonl")
        atomic_write_json(tmp / "pretrain.json", summary)
    console.print(f"pretrain: stored the base in {cache}")


def corpus_tasks(stage: PretrainStage) -> list[str]:
    """Every task the corpus reads: its own and its mix sources'."""
    mixed = [t for m in stage.corpus.mix.values() for t in m.tasks]
    return list(dict.fromkeys(stage.corpus.tasks + mixed))


def describe(stage: PretrainStage, recipe: Recipe) -> str:
    corpus = stage.corpus
    sources = (
        ", ".join(f"{n} {m.share:.0%} ({', '.join(m.tasks + m.files)})" for n, m in corpus.mix.items())
        + f"; {corpus.tokens:,} tokens"
        if corpus.mix
        else str(corpus.tasks + corpus.files)
    )
    what = f"pretrain {recipe.model.preset or recipe.model.path} on {sources}, {length(stage.train)}"
    return what + (f" (or reuse {stage.cache} if its settings match)" if stage.cache else "")


KIND = StageKind(
    name="pretrain",
    spec=PretrainStage,
    run=lambda stage, job: run_pretrain(stage, job.model, job.ctx, job.out),
    describe=describe,
    reads="base",
    produces_model=True,
    help="pre-train a preset (or continue a model) on a corpus",
    outputs=("pretrain.json",),
    tasks=corpus_tasks,
    order=10,
    epoch_rows=lambda stage: (
        EpochRows(
            stage.corpus.problems_per_task * len(stage.corpus.tasks), tuple(stage.corpus.files), packed=True
        )
        if not stage.corpus.mix
        else EpochRows(0, (), packed=True, pending="the mix is built")
    ),
    caches=lambda stage: [(("cache",), stage.cache)] if stage.cache else [],
)
