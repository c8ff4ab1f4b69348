"""What the preference stages (`dpo`, `kto`) share: their data block, the pair generator, the run.

Data comes from files in TRL's preference formats (`temper.data.preferences`) and/or is generated
from built-in tasks (`generate_pairs`): the starting model answers each prompt k times, the task's
verifier grades every answer, and a correct answer is preferred to an incorrect one (or the
shortest correct one to the longest correct one). Prompts whose k answers give no such pair (all
right, all wrong, too few correct, equal lengths) are counted and reported, never silently
dropped. Generated pairs are written to `pairs.jsonl` in TRL's conversational format and read
back through the same validation as a user's file.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json, atomic_write_text
from temper.data import contamination
from temper.data.chat import prompt_ids
from temper.data.preferences import Labelled, Pair, load_preferences
from temper.models import require_chat_template, save_trained, with_lora
from temper.rollout import HFSampler, Sampler
from temper.stages.base import (
    LoraSpec,
    StageError,
    Strict,
    epoch_steps,
    epochs_rule,
    raise_located,
    train_rules,
)
from temper.stages.context import StageContext
from temper.stages.loading import load_chat_model
from temper.tasks.base import Task, grade_batch
from temper.train.preference import Preference, PreferenceMethod
from temper.train.supervised import TrainConfig, train_supervised

console = Console(stderr=True)

Prefer = Literal["correct", "shorter"]


class GenerateSpec(Strict):
    """Pairs from built-in tasks: the starting model samples k answers per prompt, the verifier labels them."""

    tasks: list[str]
    prompts_per_task: int = Field(256, gt=0)
    """Train-split prompts per task."""
    eval_prompts: int = Field(0, ge=0)
    """Test-split prompts per task for held-out pairs (the eval/ metrics); 0: none."""
    k: int = Field(4, ge=2)
    """Answers sampled per prompt."""
    prefer: Prefer = "correct"
    """correct: a correct answer over an incorrect one; shorter: the shortest correct answer over
    the longest correct one."""
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    seed: int = 0
    # out of the settings when false: stages written before the field keep their hash
    unpaired: bool = Field(False, exclude_if=lambda v: not v)
    """kto only: every distinct non-empty answer of every prompt as an unpaired row, desirable when
    the verifier says correct, instead of pairs from the prompts whose answers disagree (KTO needs
    no pair, so the prompts whose k answers all agree still teach it)."""


class PreferenceData(Strict):
    files: list[str] = []
    """Preference data sets in TRL formats (prompt/chosen/rejected, or prompt/completion/label):
    .jsonl, .json, .parquet or .arrow files, save_to_disk folders, or hub ids."""
    eval_files: list[str] = []
    """Held-out data sets (same forms) for the eval/ metrics."""
    generate: GenerateSpec | None = None
    skip_bad_rows: bool = False
    seed: int = 1


class PreferenceDataStage(Strict):
    """The fields every stage trained on preference data has (dpo, kto, reward_model)."""

    data: PreferenceData = PreferenceData()
    max_len: int = Field(256, gt=1)
    """Prompt + completion tokens; longer ones are cut on the right (counted in the summary)."""
    train: TrainConfig = TrainConfig(max_steps=100, batch_size=8, lr=5e-6, warmup_steps=10)
    lora: LoraSpec | None = None
    """Train a LoRA adapter; the reference is then the base with the adapter disabled."""
    source: str | None = None
    """Stage whose model to start from (and the reference); default: the latest that produced a model."""

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data: Any) -> Any:
        return epochs_rule(data)

    @model_validator(mode="after")
    def _check_data(self) -> PreferenceDataStage:
        errors = [(("train", *loc), msg) for loc, msg in train_rules(self.train)]
        if not self.data.files and self.data.generate is None:
            errors.append(
                (("data",), "give data.files (preference data sets) and/or data.generate (pairs from tasks)")
            )
        raise_located(errors)
        return self


class PreferenceStage(PreferenceDataStage):
    """The fields every policy-training preference stage has (each kind adds its loss's options)."""

    beta: float = Field(0.1, gt=0)
    """Strength of the pull toward the reference (the implicit reward's scale)."""


def tasks_of(stage: PreferenceDataStage) -> list[str]:
    return stage.data.generate.tasks if stage.data.generate else []


def generate_pairs(
    sampler: Sampler,
    tokenizer,
    task: Task,
    split: str,
    n: int,
    *,
    k: int,
    prefer: Prefer,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    unpaired: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows in TRL's conversational preference format, counts) from `n` prompts of `task`, k
    answers each. Counts: prompts, pairs, the prompts that gave none by cause, `no_pair_share`
    and the accuracy of all samples. Empty answers are never used. `unpaired`: every distinct
    answer of every prompt as a prompt/completion/label row instead (counts: rows, desirable,
    undesirable; `no_pair` still says which prompts would have given no correct-vs-incorrect pair)."""
    problems = task.sample(split, n, seed)
    groups = sampler.sample(
        [prompt_ids(tokenizer, p.messages()) for p in problems],
        k,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
    )
    rng = random.Random(seed)
    rows, causes, correct_samples = [], Counter(), 0
    for problem, group in zip(problems, groups, strict=True):
        scores = grade_batch(
            task, [problem] * len(group), [s.text for s in group], [s.token_ids for s in group]
        )
        correct_samples += sum(sc.correct for sc in scores)
        right = [s for s, sc in zip(group, scores) if sc.correct and s.text.strip()]
        wrong = [s for s, sc in zip(group, scores) if not sc.correct and s.text.strip()]
        if unpaired:
            if not right or not wrong:
                causes["all_wrong" if not right else "all_correct"] += 1
            distinct = {s.text: label for label, side in ((True, right), (False, wrong)) for s in side}
            rows += [
                {
                    "prompt": problem.messages(),
                    "completion": [{"role": "assistant", "content": text}],
                    "label": label,
                }
                for text, label in distinct.items()
            ]
            continue
        if prefer == "correct":
            if not right or not wrong:
                causes["all_wrong" if not right else "all_correct"] += 1
                continue
            chosen, rejected = rng.choice(right), rng.choice(wrong)
        else:
            if len(right) < 2:
                causes["fewer_than_2_correct"] += 1
                continue
            right.sort(key=lambda s: len(s.token_ids))
            chosen, rejected = right[0], right[-1]
            if len(chosen.token_ids) == len(rejected.token_ids):
                causes["correct_all_same_length"] += 1
                continue
        rows.append(
            {
                "prompt": problem.messages(),
                "chosen": [{"role": "assistant", "content": chosen.text}],
                "rejected": [{"role": "assistant", "content": rejected.text}],
            }
        )
    paired = len(problems) - sum(causes.values())
    counts = {"prompts": len(problems)}
    if unpaired:
        desirable = sum(r["label"] for r in rows)
        counts |= {"rows": len(rows), "desirable": desirable, "undesirable": len(rows) - desirable}
    else:
        counts["pairs"] = len(rows)
    counts |= {
        "no_pair": dict(causes),
        "no_pair_share": (len(problems) - paired) / max(len(problems), 1),
        "sample_accuracy": correct_samples / max(len(problems) * k, 1),
    }
    return rows, counts


def _generated(
    spec: GenerateSpec,
    ctx: StageContext,
    sampler: Sampler,
    tokenizer,
    split: str,
    n: int,
    out: Path,
    name: str,
) -> tuple[list[Pair | Labelled], dict[str, Any]]:
    rows, counts = [], {}
    for task_name in spec.tasks:
        got, counts[task_name] = generate_pairs(
            sampler,
            tokenizer,
            ctx.tasks[task_name],
            split,
            n,
            k=spec.k,
            prefer=spec.prefer,
            temperature=spec.temperature,
            max_new_tokens=spec.max_new_tokens,
            seed=spec.seed,
            unpaired=spec.unpaired,
        )
        rows += got
        c = counts[task_name]
        made = (
            f"{c['rows']} labelled answers ({c['desirable']} desirable)"
            if spec.unpaired
            else f"{c['pairs']} pairs"
        )
        console.print(
            f"pairs ({split}): {task_name}: {made} from {c['prompts']} prompts; no pair from "
            f"{100 * c['no_pair_share']:.0f}% ({', '.join(f'{k} {v}' for k, v in c['no_pair'].items()) or 'none'}); "
            f"sample accuracy {100 * c['sample_accuracy']:.0f}%"
        )
    path = out / name
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return (load_preferences(path)[0] if rows else []), counts


def generated_rows(
    spec: GenerateSpec, ctx: StageContext, model, tokenizer, out: Path
) -> tuple[list[Pair | Labelled], list[Pair | Labelled], dict[str, Any]]:
    """(train rows, held-out rows, counts) generated by `model` as `spec` says, on the main
    process (the others receive them), written to `out`/pairs.jsonl and eval_pairs.jsonl. The
    same spec and model give the same rows (per-prompt sampling seeds), so two stages with one
    `generate` block and one source train on the same pairs."""
    model.eval()
    sampler = HFSampler(model, tokenizer)

    def generate() -> tuple[Any, ...]:
        got, counts = _generated(
            spec, ctx, sampler, tokenizer, "train", spec.prompts_per_task, out, "pairs.jsonl"
        )
        ev, ev_counts = (
            _generated(spec, ctx, sampler, tokenizer, "test", spec.eval_prompts, out, "eval_pairs.jsonl")
            if spec.eval_prompts
            else ([], {})
        )
        return got, counts, ev, ev_counts

    got, counts, ev, ev_counts = distributed.on_main(generate)
    return got, ev, {"train": counts} | ({"test": ev_counts} if ev_counts else {})


def preference_rows(
    stage: PreferenceDataStage, ctx: StageContext, model, tokenizer, out: Path
) -> tuple[list[Pair | Labelled], list[Pair | Labelled], dict[str, Any]]:
    """(train rows, held-out rows, summary of where they came from)."""
    data, summary = stage.data, {"skipped_rows": {}}
    train: list[Pair | Labelled] = []
    held_out: list[Pair | Labelled] = []
    if data.generate:
        got, ev, summary["generated"] = generated_rows(data.generate, ctx, model, tokenizer, out)
        train += got
        held_out += ev
    for files, into in ((data.files, train), (data.eval_files, held_out)):
        for spec_ in files:
            rows, report = load_preferences(spec_, ctx.base_dir, skip_bad_rows=data.skip_bad_rows)
            into += rows
            if report.skipped:
                summary["skipped_rows"][spec_] = report.skipped
                console.print(
                    f"[yellow]warning[/]: skipped {report.skipped} bad rows of {spec_}; first: {report.errors[0]}"
                )
    random.Random(data.seed).shuffle(train)
    return train, held_out, summary


def preference_items(
    stage: Any,
    kind: str,
    ctx: StageContext,
    source: Path | str,
    out: Path,
    build: Callable[[Any, list[Pair | Labelled], int], tuple[list[Any], Any]],
    unit: str = "items",
) -> tuple[Any, Any, list[Any], list[Any], Any, dict[str, Any]]:
    """The data set-up every preference-trained stage shares (dpo, kto, reward_model): load the
    source, read or generate the rows, screen them for contamination, tokenize them with `build`
    -> (tokenizer, model, items, held-out items, tokenization stats, summary for `<kind>.json`).
    Nothing to train on is a StageError naming the sources."""
    tokenizer, model = load_chat_model(source, ctx, need_template=False)
    train_rows, eval_rows, summary = preference_rows(stage, ctx, model, tokenizer, out)
    train_rows, summary["contamination"] = contamination.screen(train_rows, ctx, kind)
    if any(not isinstance(r.prompt, str) for r in train_rows + eval_rows):
        require_chat_template(tokenizer, source)
    items, stats = build(tokenizer, train_rows, stage.max_len)
    eval_items, _ = build(tokenizer, eval_rows, stage.max_len) if eval_rows else ([], None)
    if not items:
        where = [f"task:{t}" for t in tasks_of(stage)] + stage.data.files
        raise StageError(
            f"{kind}: nothing to train on from {', '.join(where)}: {stats.rows} rows, {stats.dropped} "
            f"longer than max_len={stage.max_len}"
            + (" (the generator found no usable pair: see pairs above)" if stage.data.generate else "")
        )
    console.print(
        f"{kind}: {len(items)} {unit} ({stats.truncated} completions truncated, {stats.dropped} dropped), "
        f"{len(eval_items)} held-out"
        + ("" if eval_items else " (give data.eval_files or data.generate.eval_prompts for held-out figures)")
    )
    return tokenizer, model, items, eval_items, stats, summary


def run_preference(
    stage: PreferenceStage,
    kind: str,
    ctx: StageContext,
    source: Path | str,
    out: Path,
    build: Callable[[Any, list[Pair | Labelled], int], tuple[list[Any], Any]],
    method: PreferenceMethod,
) -> Path:
    """Read or generate the data, tokenize it (`build(tokenizer, rows, max_len) -> (items, stats)`),
    train `method` from `source` against itself as the reference, save the model and `<kind>.json`."""
    tokenizer, model, items, eval_items, stats, summary = preference_items(
        stage, kind, ctx, source, out, build
    )
    config = epoch_steps(stage.train, len(items), kind)
    model = with_lora(model, stage.lora and stage.lora.adapter_args())
    objective = Preference(method, tokenizer.pad_token_id)
    result = train_supervised(model, items, config, out, objective=objective, eval_set=eval_items)
    model_dir = save_trained(model, tokenizer, out / "model", stage.lora.save if stage.lora else "merged")
    if distributed.is_main():
        final = result.history[-1] if result.history else {}
        atomic_write_json(
            out / f"{kind}.json",
            summary
            | {
                "data": vars(stats),
                "steps": result.steps,
                "final_loss": result.final_loss,
                "eval_loss": result.eval_loss,
                "seconds": result.seconds,
                "tokens": result.tokens,
                "precision": result.precision,
                "final": final,
            },
        )
    return model_dir
