"""Run a recipe's stages in order, each into its own folder, skipping stages already complete.

A stage is complete when its folder holds `stage.json` with the hash of its settings and of its
inputs; change either and it runs again. An interrupted training stage resumes from its newest
checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json, atomic_write_text
from temper.recipe import Recipe
from temper.stages.context import StageContext, settings_hash
from temper.stages.evaluation import eval_table, run_eval
from temper.stages.pretrain import run_pretrain
from temper.stages.rl import run_rl
from temper.stages.sft import run_sft
from temper.tasks import make_recipe_task

console = Console(stderr=True)


def _stage_hash(recipe: Recipe, index: int, ctx: StageContext) -> str:
    stage = recipe.stages[index]
    settings = stage.model_dump(exclude={"train": {"progress"}} if hasattr(stage, "train") else None)
    if stage.kind == "pretrain":
        upstream = recipe.model.model_dump()
    elif stage.kind in ("sft", "rl"):
        if stage.source:
            upstream = ctx.model_hashes[stage.source]
        else:
            upstream = list(ctx.model_hashes.values())[-1] if ctx.model_hashes else recipe.model.model_dump()
    else:
        upstream = {m: ctx.model_hashes[m] for m in (stage.models or ctx.model_hashes)}
    return settings_hash(stage.kind, settings, upstream, ctx.task_options)


def stage_dir(run_dir: Path, index: int, name: str) -> Path:
    return run_dir / f"{index + 1:02d}-{name}"


def plan(recipe: Recipe, run_dir: Path) -> list[str]:
    """One line per stage: what it does and whether it would run or be skipped."""
    lines = []
    for i, stage in enumerate(recipe.stages):
        out = stage_dir(run_dir, i, stage.name)
        state = "complete" if (out / "stage.json").exists() else "to run"
        if stage.kind == "pretrain":
            what = f"pretrain {recipe.model.preset or recipe.model.path} on {stage.corpus.tasks + stage.corpus.files}, {stage.train.max_steps} steps"
            if stage.cache:
                what += f" (or reuse {stage.cache} if its settings match)"
        elif stage.kind == "sft":
            what = f"sft on {stage.data.tasks + stage.data.files}, {stage.train.max_steps} steps" + (
                f", LoRA r={stage.lora.r}" if stage.lora else ""
            )
        elif stage.kind == "rl":
            t = stage.train
            what = (
                f"rl ({t.advantage}) on {stage.tasks}, {t.steps} steps x {t.prompts_per_step} prompts x {t.group_size} samples"
                + (f", gate parse rate >= {stage.gate.min_parse_rate}" if stage.gate else "")
            )
        else:
            what = f"eval {stage.models or 'all models'} on {stage.tasks or list(recipe.tasks)} {stage.splits}, {stage.n_problems} problems, k={stage.k}"
        lines.append(f"{i + 1}. {stage.name}: {what} -> {out} [{state}]")
    return lines


def run_recipe(recipe: Recipe, base_dir: Path, run_dir: Path, recipe_text: str = "") -> Path:
    """Run every stage; return the run folder (which ends with report.html).

    Under a multi-process launch (see temper.distributed) every process trains; only the main
    process writes markers, evaluates and reports, and the others wait for it at each stage
    boundary."""
    state = distributed.state()
    main = state.is_main_process
    run_dir.mkdir(parents=True, exist_ok=True)
    if recipe_text and main:
        atomic_write_text(run_dir / "recipe.yaml", recipe_text)
    tasks = {name: make_recipe_task(name, opts) for name, opts in recipe.tasks.items()}
    ctx = StageContext(run_dir=run_dir, base_dir=base_dir, tasks=tasks, task_options=recipe.tasks)
    for i, stage in enumerate(recipe.stages):
        out = stage_dir(run_dir, i, stage.name)
        digest = _stage_hash(recipe, i, ctx)
        marker = out / "stage.json"
        if marker.exists() and _read_hash(marker) == digest:
            console.print(f"[dim]{stage.name}: complete, skipped ({out})[/]")
        else:
            if main:
                if out.exists() and _read_hash(out / "stage.started.json") != digest:
                    shutil.rmtree(out)  # settings changed: old checkpoints must not be resumed
                out.mkdir(parents=True, exist_ok=True)
                marker.unlink(missing_ok=True)
                atomic_write_json(out / "stage.started.json", {"hash": digest})
                console.rule(f"[bold]{stage.name}[/] ({stage.kind})")
            state.wait_for_everyone()
            start = time.perf_counter()
            if stage.kind == "eval":  # main only; the others wait (and raise if it fails)
                distributed.on_main(_run_stage, recipe, i, ctx, out)
            else:
                _run_stage(recipe, i, ctx, out)
            if main:
                atomic_write_json(
                    marker, {"hash": digest, "kind": stage.kind, "seconds": time.perf_counter() - start}
                )
            state.wait_for_everyone()
        if stage.kind in ("pretrain", "sft", "rl"):
            ctx.models[stage.name] = out / "model"
            ctx.model_hashes[stage.name] = digest
        if stage.kind == "eval" and main:
            print(eval_table(json.loads((out / "eval.json").read_text())), flush=True)
    if main:
        from temper.report import write_report  # imported late: matplotlib is slow to import

        console.print(f"report: {write_report(run_dir)}")
    return run_dir


def _read_hash(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("hash")
    except (OSError, ValueError):
        return None


def _run_stage(recipe: Recipe, index: int, ctx: StageContext, out: Path) -> None:
    stage = recipe.stages[index]
    if stage.kind == "pretrain":
        run_pretrain(stage, recipe.model, ctx, out)
    elif stage.kind in ("sft", "rl"):
        if stage.source:
            source = ctx.models[stage.source]
        else:  # the latest model, or the user's model (local dir or hub id) trained directly
            source = list(ctx.models.values())[-1] if ctx.models else recipe.model.path
        (run_sft if stage.kind == "sft" else run_rl)(stage, ctx, source, out)
    else:
        run_eval(stage, ctx, out)
