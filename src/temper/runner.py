"""Run a recipe's stages in order, each into its own folder, skipping stages already complete.

A stage is complete when its folder holds `stage.json` with the hash of its settings and of its
inputs; change either and it runs again. An interrupted training stage resumes from its newest
checkpoint.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json, atomic_write_text, remove_stale
from temper.catalog import make_recipe_task, task_fingerprints
from temper.preflight import produced_files
from temper.recipe import Recipe, model_refs
from temper.stages import registry
from temper.stages.base import EvalSet, StageRun, folder_digest
from temper.stages.context import StageContext, settings_hash
from temper.stages.markers import read_hash, stage_settings

console = Console(stderr=True)


def _inputs(recipe: Recipe, index: int, ctx: StageContext) -> tuple[Path | str | None, Any]:
    """(the model a stage starts from, what of its inputs its hash covers), by what its kind reads."""
    stage = recipe.stages[index]
    reads, refs = registry.get(stage.kind).reads, model_refs(stage)
    if reads == "base":
        return None, recipe.model.weights()
    if reads == "models":
        return None, {m: ctx.model_hashes[m] for m in (refs or ctx.model_hashes)}
    if refs and refs[0] in ctx.models:
        return ctx.models[refs[0]], ctx.model_hashes[refs[0]]
    if refs and not recipe.model.path:  # `source: base` of a preset: the pretrained base
        first = next(iter(ctx.models))
        return ctx.models[first], ctx.model_hashes[first]
    if ctx.models and not refs:  # the latest model
        return list(ctx.models.values())[-1], list(ctx.model_hashes.values())[-1]
    # the user's model (no model stage before it, or `source: base`): a local folder
    # (relative to the recipe) or a hub id
    return ctx.model_source(recipe.model.path) if recipe.model.path else None, recipe.model.weights()


def eval_specs(recipe: Recipe) -> list[EvalSet]:
    """(tasks, splits, n_problems, seed) of each eval set the stages contribute (`StageKind.eval_sets`):
    the eval sets training data is checked against."""
    return [e for s in recipe.stages for e in registry.get(s.kind).eval_sets(s)]


def _stage_hash(recipe: Recipe, index: int, ctx: StageContext) -> str:
    stage = recipe.stages[index]
    parts = [stage.kind, stage_settings(stage), _inputs(recipe, index, ctx)[1], ctx.task_options]
    if recipe.contamination.action == "drop" and registry.get(stage.kind).reads != "base":
        # dropping changes what trains; the default (warn) only counts, and leaves every hash as it was
        parts.append([recipe.contamination.model_dump(), eval_specs(recipe)])
    uses = registry.get(stage.kind).uses(stage)
    if models := [u for u in uses if len(u) == 2]:  # a path or hub id is covered as written
        parts.append({ref: ctx.output_hashes.get(ref, ref) for _, ref in models})
    if ctx.chat and registry.get(stage.kind).reads != "base":  # only the stages that render chats
        parts.append(ctx.chat.hashed(ctx.base_dir))
    if produced := produced_files(recipe, index, ctx.base_dir):  # e.g. a constitutional stage's pairs
        parts.append({str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in produced if p.exists()})
    for _, name in registry.get(stage.kind).files(stage):  # e.g. a harness file: its bytes
        path = ctx.resolve(name)
        parts.append({name: hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"})
    for _, ref, kind in (u for u in uses if len(u) == 3):  # e.g. a reward model: its files
        parts.append(folder_digest(ctx.export_dir(ref, registry.get(kind).exports)))
    fingerprints = task_fingerprints(ctx.tasks)  # data tasks: their rows and reward code
    return settings_hash(*parts, fingerprints) if fingerprints else settings_hash(*parts)


def stage_dir(run_dir: Path, index: int, name: str) -> Path:
    return run_dir / f"{index + 1:02d}-{name}"


def plan(recipe: Recipe, run_dir: Path) -> list[str]:
    """One line per stage: what it does and whether it would run or be skipped."""
    lines = []
    for i, stage in enumerate(recipe.stages):
        out = stage_dir(run_dir, i, stage.name)
        state = "complete" if (out / "stage.json").exists() else "to run"
        what = registry.get(stage.kind).describe(stage, recipe)
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
    if main:
        remove_stale(run_dir, depth=0)  # e.g. a report whose writing was killed
    if recipe_text and main:
        atomic_write_text(run_dir / "recipe.yaml", recipe_text)
    tasks = {name: make_recipe_task(name, opts, base_dir) for name, opts in recipe.tasks.items()}
    ctx = StageContext(
        run_dir=run_dir, base_dir=base_dir, tasks=tasks, task_options=recipe.tasks, chat=recipe.model.chat()
    )
    ctx.contamination, ctx.eval_specs = recipe.contamination, eval_specs(recipe)
    for i, stage in enumerate(recipe.stages):
        kind = registry.get(stage.kind)
        out = stage_dir(run_dir, i, stage.name)
        if kind.reads == "models" and not ctx.models and recipe.model.path:
            # no model stage before it (an eval-only recipe): it reads the recipe's own model
            ctx.models[recipe.model.path] = ctx.model_source(recipe.model.path)  # type: ignore[assignment]  # a hub id stays a str
            ctx.model_hashes[recipe.model.path] = settings_hash(recipe.model.weights())
        digest = _stage_hash(recipe, i, ctx)
        marker = out / "stage.json"
        if marker.exists() and read_hash(marker) == digest:
            console.print(f"[dim]{stage.name}: complete, skipped ({out})[/]")
        else:
            if main:
                if out.exists() and read_hash(out / "stage.started.json") != digest:
                    shutil.rmtree(out)  # settings changed: old checkpoints must not be resumed
                out.mkdir(parents=True, exist_ok=True)
                remove_stale(out)  # what a killed run left half-written (temp model, partial checkpoints)
                marker.unlink(missing_ok=True)
                atomic_write_json(out / "stage.started.json", {"hash": digest})
                console.rule(f"[bold]{stage.name}[/] ({stage.kind})")
            state.wait_for_everyone()
            start = time.perf_counter()
            run = StageRun(ctx, out, recipe.model, _inputs(recipe, i, ctx)[0])
            if kind.main_only:  # the others wait (and raise if it fails)
                distributed.on_main(kind.run, stage, run)
            else:
                kind.run(stage, run)
            if main:
                atomic_write_json(
                    marker, {"hash": digest, "kind": stage.kind, "seconds": time.perf_counter() - start}
                )
            state.wait_for_everyone()
        ctx.stage_dirs[stage.name], ctx.output_hashes[stage.name] = out, digest
        if kind.produces_model:
            ctx.models[stage.name] = out / "model"
            ctx.model_hashes[stage.name] = digest
        if kind.summary and main:
            print(kind.summary(out), flush=True)
    if main:
        from temper.report import write_report  # imported late: matplotlib is slow to import

        console.print(f"report: {write_report(run_dir)}")
    return run_dir
