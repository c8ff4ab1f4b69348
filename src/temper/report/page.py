"""The page: a header with a row per stage, then each stage's section, chosen by its kind (`sections.py`)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from temper.atomic import atomic_write_text
from temper.report.common import CSS, Stage, boxes, duration, esc, html_table, read_json
from temper.report.models import models_table, precision
from temper.report.sections import section_for
from temper.report.tools_used import tools_line
from temper.stages import registry


def _guess_kind(folder: Path) -> str:
    """The kind of a stage that never wrote stage.json, from what it left ("training": a curve so far)."""
    for kind in registry.kinds().values():
        if any((folder / name).exists() for name in kind.outputs):
            return kind.name
    return "training" if (folder / "metrics.jsonl").exists() else "?"


def find_stages(run_dir: Path) -> list[Stage]:
    """The stage folders NN-name in NN order; one without a readable stage.json is incomplete."""
    folders = [p for p in run_dir.iterdir() if p.is_dir() and re.match(r"\d+-", p.name)]
    stages = []
    for folder in sorted(folders, key=lambda p: (int(p.name.split("-")[0]), p.name)):
        try:
            info = read_json(folder / "stage.json") or {}
        except ValueError:
            info = {}
        seconds = info.get("seconds")
        kind = info.get("kind") or _guess_kind(folder)
        stages.append(Stage(folder, kind, float(seconds) if seconds is not None else None))
    return stages


def _precision(stage: Stage) -> str:
    try:
        return precision(stage)
    except ValueError:  # an unreadable summary: the stage's own section names it
        return "?"


def _models(run_dir: Path, stages: list[Stage]) -> str:
    """The model and tokenizer block; a broken file in it is a note, not a lost page."""
    try:
        return models_table(run_dir, stages)
    except (OSError, ValueError) as e:
        return boxes([f"could not read the models: {e}"])


def _tools(stages: list[Stage]) -> str:
    """The tools the run's episodes called; a broken eval.json is a note, not a lost page."""
    try:
        return tools_line(stages)
    except (OSError, ValueError) as e:
        return boxes([f"could not read the tool use: {e}"])


def header(run_dir: Path, stages: list[Stage]) -> str:
    """Run name, when the page was written, total time, the model and tokenizers, the tools the
    episodes called, and a row per stage with the precision it ran in (incomplete ones flagged)."""
    total = sum(s.seconds for s in stages if s.seconds is not None)
    open_ = {i for i, s in enumerate(stages) if s.seconds is None}
    rows = [
        [
            s.folder.name,
            s.kind,
            duration(s.seconds),
            "incomplete" if i in open_ else "complete",
            _precision(s),
        ]
        for i, s in enumerate(stages)
    ]
    table = html_table(rows, ["stage", "kind", "time", "status", "precision"], open_)
    recipe = run_dir / "recipe.yaml"
    if recipe.exists():
        table += f"<details><summary>recipe.yaml</summary><pre>{esc(recipe.read_text())}</pre></details>"
    written = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"<h1>{esc(run_dir.name)}</h1><p><small>report written {written} · total stage time {duration(total)}"
        f" · {esc(run_dir.resolve())}</small></p>{_models(run_dir, stages)}{_tools(stages)}"
        f"{table or '<p>No stages yet.</p>'}"
    )


def _section(stage: Stage, plots: Path) -> str:
    """One stage's section; a missing or unreadable file becomes a note instead of no report at all."""
    try:
        return section_for(stage.kind)(stage, plots)
    except (OSError, ValueError) as e:
        return boxes([f"could not read this stage's outputs: {e}"])


def write_report(run_dir: Path) -> Path:
    """Write `run_dir/report.html` (and its plots under `run_dir/plots/`) and return its path."""
    run_dir = Path(run_dir)
    plots = run_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    stages = find_stages(run_dir)
    body = [header(run_dir, stages)]
    for s in stages:
        body.append(f"<h2>{esc(s.folder.name)} <small>{esc(s.kind)}</small></h2>{_section(s, plots)}")
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(run_dir.name)} · temper</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    out = run_dir / "report.html"
    atomic_write_text(out, page)
    return out
