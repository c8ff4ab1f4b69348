"""Run a recipe over seeds x a grid of overrides, in parallel worker processes, and report means
with spread.

Seeds. The stages named in --vary get the seed in their `train.seed` (and `data.seed` for SFT,
and the `seed` of the pairs they generate: `data.generate` of dpo/kto, `data.pairs` of SFT),
every other stage stays as written (so a shared start, e.g. the shipped base and a format SFT,
is the same for all seeds).

Grid. Each `--grid KEY=V1,V2,...` is one axis; the cells are the product of the axes, in the
order given. KEY is a dotted path into the recipe's YAML, where a segment after `stages` names a
stage (its `name`, or its kind when unnamed): `tasks.gp.n_cards=2,3,4`,
`stages.sft.train.max_steps=300,600`. Values are read as YAML (`3` is an int, `true` a bool,
`[11,12,13]` a list: commas inside brackets do not split values).
`--set KEY=V` overrides every cell the same way.

Folders. Without --grid each seed runs into `<run_dir>/seed-<s>/` (the layout the other
experiment scripts read); with a grid into `<run_dir>/<cell>/seed-<s>/`, the cell named by its
values (`n_cards=3,target=10`). A (cell, seed) whose folder holds this exact recipe text and a
completion marker (`stage.json`) in every stage folder is finished and skipped before any process
starts, so an interrupted sweep resumes where it stopped; an unfinished one goes to the runner,
whose own stage skipping and checkpoint resume take over inside it.

Shared start. The leading stages that no seed changes (the shipped base, a format SFT) are the
same for every seed, so they run once per cell into `<cell>/shared/` before the seeds start and
are copied into each seed's folder, where the runner finds the same stage hash and skips them
(an SFT start on the small base is a third of a seed's compute). A copy whose hash does not
match (e.g. `contamination.action: drop`, which hashes the eval sets) is simply rerun.

Workers. `--workers` (default: os.cpu_count()) processes run the (cell, seed) jobs; each gets
`--threads` torch threads (default cores // workers), and workers x threads may not exceed the
cores: on 2 cores that is 2 x 1 or 1 x 2. Parallel jobs log to `<seed folder>/run.log`; with
one worker the run prints to the terminal as before. Workers are spawned, never forked (a forked
process inherits torch's thread pool in an undefined state).

Tables. Per cell, the eval table (mean ± sample std, [min, max] over seeds, and the compute each
model stage used) goes to stdout and --out; with a grid a first table puts every cell's greedy
accuracy and parse rate side by side, and --plot draws greedy accuracy per cell with the spread
over seeds (mean ± std, each seed a dot). With --baseline MODEL, a second table gives each other
model's per-seed difference from MODEL (same seed, same task and split) with its mean and 95%
t-interval.

    python experiments/multiseed.py recipes/sft_vs_rl_general_points.yaml --seeds 0 1 2 \\
        --vary sft_branch,rl_branch --out results/sft_vs_rl_general_points.md
    python experiments/multiseed.py recipes/general_points_configs.yaml --seeds 0 --vary sft \\
        --grid tasks.gp.n_cards=2,3,4 --grid tasks.gp.target=10,24 --workers 1 \\
        --out results/general_points_configs_grid.md --plot results/general_points_configs.png

Why plain concurrent.futures and no sweep library (checked against the package index and
pyproject.toml, which holds none of them):
- Ray Tune (ray 2.60) is a distributed scheduler: a wheel of tens of MB with its own
  dependencies (grpcio, protobuf, msgpack, ...), a local cluster (raylet, GCS, object store)
  started per sweep that costs seconds and hundreds of MB of memory on a 2-core machine, and
  trial folders and resume of its own. Its value (early-stopping schedulers, search algorithms,
  many machines) does not apply: a cell here is a whole recipe that already resumes by its stage
  markers, and the grid is small and exhaustive.
- Hydra multirun (hydra-core 1.3.8 + omegaconf + antlr4 runtime) wants the program's config in
  Hydra's composition tree and owns the command line and the working directory; its basic
  launcher runs cells one after another (parallel needs the joblib launcher plugin, last
  released 2022), and it has no resume. Our recipes are validated YAML with their own loader.
- concurrent.futures.ProcessPoolExecutor is in the standard library: no dependency, no start-up
  beyond the worker processes, and what a sweep here needs (a product of overrides, a skip
  check, a process pool with a thread budget) is a few dozen lines.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import itertools
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tables import spread, table

from temper.atomic import atomic_write_text
from temper.recipe import parse_recipe
from temper.runner import run_recipe, stage_dir


def parse_axis(spec: str) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` -> (KEY, [V1, V2, ...]), each value read as YAML."""
    key, sep, values = spec.partition("=")
    if not sep or not key or not values:
        raise SystemExit(f"--grid/--set {spec!r}: expected KEY=V1,V2,...")
    parts, depth, start = [], 0, 0
    for i, char in enumerate(values):  # commas inside [...] or {...} belong to the value
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            parts.append(values[start:i])
            start = i + 1
    return key.strip(), [yaml.safe_load(v) for v in [*parts, values[start:]]]


def expand_grid(axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """The product of the axes, first axis slowest: [{key: value, ...}, ...]; no axes: one empty cell."""
    keys = [k for k, _ in axes]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"--grid: a key appears twice ({keys})")
    return [dict(zip(keys, values)) for values in itertools.product(*(v for _, v in axes))]


def cell_name(cell: dict[str, Any]) -> str:
    """A cell's folder name: `leaf=value` joined by commas (the full key when two leaves clash)."""
    leaves = [k.rsplit(".", 1)[-1] for k in cell]
    names = [leaf if leaves.count(leaf) == 1 else key for leaf, key in zip(leaves, cell)]
    text = ",".join(
        f"{n}={json.dumps(v) if not isinstance(v, str) else v}" for n, v in zip(names, cell.values())
    )
    return text.replace("/", "_").replace(" ", "")


def apply_override(data: dict, key: str, value: Any) -> None:
    """Set the dotted `key` of the recipe's YAML data to `value`; a segment after `stages` is a
    stage's name (or its kind when unnamed). Missing mappings on the way are created."""
    node: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):  # the stages list
            names = [s.get("name", s["kind"]) for s in node]
            if part not in names:
                raise SystemExit(f"override {key!r}: no stage named {part!r} (stages: {names})")
            node = node[names.index(part)]
        else:
            child = node.setdefault(part, {})
            if not isinstance(child, dict | list):
                raise SystemExit(f"override {key!r}: {'.'.join(parts[: i + 1])} is {child!r}, not a mapping")
            node = child
    if isinstance(node, list):
        raise SystemExit(f"override {key!r}: name a setting of the stage, not the stage itself")
    node[parts[-1]] = value


def seeded_recipe(text: str, seed: int, vary: list[str], overrides: dict[str, Any] | None = None):
    data = yaml.safe_load(text)
    # a YAML alias (`generate: *pairs`) loads as one dict shared by the stages that name it: copy
    # each stage, so a seed given to a varied stage never reaches the others
    data["stages"] = [copy.deepcopy(stage) for stage in data["stages"]]
    for key, value in (overrides or {}).items():
        apply_override(data, key, value)
    names = [s.get("name", s["kind"]) for s in data["stages"]]
    for name in vary:
        if name not in names:
            raise SystemExit(f"--vary: no stage named {name!r} (stages: {names})")
    for stage in data["stages"]:
        if stage.get("name", stage["kind"]) in vary:
            stage.setdefault("train", {})["seed"] = seed
            if stage["kind"] == "sft":
                stage.setdefault("data", {})["seed"] = 1000 + seed
            if stage["kind"] == "rft":  # its sampling seed too: other problems, other samples
                stage["seed"] = seed
            for block in ("generate", "pairs"):  # generated preference pairs: the samples vary too
                if isinstance(stage.get("data", {}).get(block), dict):
                    stage["data"][block]["seed"] = seed
    return parse_recipe(yaml.safe_dump(data, sort_keys=False)), yaml.safe_dump(data, sort_keys=False)


# two-sided 95% quantiles of Student's t by degrees of freedom (any statistics table); beyond 10
# the normal 1.96 understates the interval by < 14%, said where it is used
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def paired(diffs: list[float]) -> str:
    """Mean difference and its 95% t-interval over seeds, in points: m ± t s / sqrt(n)."""
    n, m = len(diffs), statistics.mean(diffs)
    if n < 2:
        return f"{100 * m:+.1f}"
    half = T975.get(n - 1, 1.96) * statistics.stdev(diffs) / n**0.5
    return f"{100 * m:+.1f} [{100 * (m - half):+.1f}, {100 * (m + half):+.1f}]"


def _metrics(result: dict, key: str) -> float:
    return result["metrics"][key if key == "greedy_accuracy" else f"mean@{result['k']}"]["value"]


# --- the sweep: jobs, the skip check, the worker budget, the pool ---------------------------


@dataclass(frozen=True)
class Job:
    """One recipe run: a cell of the grid at one seed, into `run_dir`."""

    cell: str  # the cell's folder name; "" without a grid
    seed: int
    text: str  # the recipe as this job runs it (overrides and seed applied)
    run_dir: Path


def build_jobs(
    text: str,
    root: Path,
    seeds: list[int],
    vary: list[str],
    cells: list[dict[str, Any]],
    fixed: dict[str, Any] | None = None,
) -> tuple[list[Job], dict[str, Any]]:
    """Every (cell, seed) job, cells slowest, with the `fixed` overrides in every cell (they do not
    name the folder); and each cell's parsed recipe (for the tables)."""
    jobs, recipes = [], {}
    for cell in cells:
        name = cell_name(cell)
        for seed in seeds:
            recipe, seeded = seeded_recipe(text, seed, vary, (fixed or {}) | cell)
            jobs.append(
                Job(name, seed, seeded, root / name / f"seed-{seed}" if name else root / f"seed-{seed}")
            )
            recipes[name] = recipe
    return jobs, recipes


def finished(job: Job) -> bool:
    """Whether the job's folder holds this exact recipe and every stage's completion marker."""
    recipe_file = job.run_dir / "recipe.yaml"
    if not recipe_file.exists() or recipe_file.read_text() != job.text:
        return False
    stages = yaml.safe_load(job.text)["stages"]
    return all(
        (stage_dir(job.run_dir, i, s.get("name", s["kind"])) / "stage.json").exists()
        for i, s in enumerate(stages)
    )


def budget(workers: int | None, threads: int | None, cores: int, jobs: int) -> tuple[int, int]:
    """(worker processes, torch threads each) with workers x threads <= cores: by default one
    worker per core (per `threads` cores when only that is given; never more workers than jobs)
    and the cores shared out among them."""
    cores = max(1, cores)
    workers = min(workers or max(1, cores // (threads or 1)), max(1, jobs))
    if workers > cores:
        raise SystemExit(f"--workers {workers} is more than the {cores} cores")
    threads = threads or max(1, cores // workers)
    if workers * threads > cores:
        raise SystemExit(f"--workers {workers} x --threads {threads} is more than the {cores} cores")
    return workers, threads


def start_budget(workers: int, threads: int, starts: int) -> tuple[int, int]:
    """(workers, threads) for `starts` shared starts: fewer starts than workers (often one) share
    out the whole core budget, so a lone start runs on every core instead of leaving some idle."""
    start_workers = max(1, min(workers, starts))
    return start_workers, workers * threads // start_workers


def run_job(job: Job, base_dir: Path, threads: int, log: bool) -> float:
    """Run one job (in this process); with `log`, its output goes to `<run_dir>/run.log`.
    Returns its wall seconds."""
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    job.run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if log:  # the file descriptors too: C-level and subprocess output would bypass sys.stdout
            out = stack.enter_context(open(job.run_dir / "run.log", "a"))
            sys.stdout.flush(), sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(out.fileno(), 1), os.dup2(out.fileno(), 2)
            stack.callback(
                lambda: (sys.stdout.flush(), sys.stderr.flush(), os.dup2(saved[0], 1), os.dup2(saved[1], 2))
            )
        run_recipe(parse_recipe(job.text), base_dir, job.run_dir, job.text)
    return time.perf_counter() - start


def shared_start(jobs: list[Job], vary: list[str]) -> list[tuple[Job, list[Job]]]:
    """(start job, the seeds it serves) per cell with two or more unfinished seeds: the recipe cut
    to its leading stages that no seed changes (the shipped base, a format SFT), to run once into
    `<cell>/shared/` and copy into each seed's folder, where the runner finds the same stage hash
    and skips it. Leading stages only: they cannot read a varied stage's model."""
    by_cell: dict[str, list[Job]] = {}
    for job in jobs:
        by_cell.setdefault(job.cell, []).append(job)
    out = []
    for cell_jobs in by_cell.values():
        if len(cell_jobs) < 2:
            continue
        data = yaml.safe_load(cell_jobs[0].text)
        lead = 0
        for stage in data["stages"]:
            if stage.get("name", stage["kind"]) in vary or stage["kind"] == "eval":
                break
            lead += 1
        if lead == 0:
            continue
        data["stages"] = data["stages"][:lead]
        first = cell_jobs[0]
        start = Job(
            first.cell, first.seed, yaml.safe_dump(data, sort_keys=False), first.run_dir.parent / "shared"
        )
        out.append((start, cell_jobs))
    return out


def _copy_start(start: Job, seeds: list[Job]) -> None:
    """Copy the shared start's finished stage folders into each seed that has none of its own."""
    for i, stage in enumerate(yaml.safe_load(start.text)["stages"]):
        source = stage_dir(start.run_dir, i, stage.get("name", stage["kind"]))
        for job in seeds:
            target = stage_dir(job.run_dir, i, stage.get("name", stage["kind"]))
            if (source / "stage.json").exists() and not target.exists():
                shutil.copytree(source, target)


def run_sweep(
    jobs: list[Job], base_dir: Path, workers: int, threads: int, run=run_job, vary: list[str] | None = None
) -> dict[Job, str]:
    """Run the unfinished jobs, `workers` at a time; {job: "skipped" | "ran in N s" | "failed: ..."}.
    A failed job is reported, not fatal: the other cells still run (and rerunning resumes it).
    With `vary`, each cell's shared start runs once first (`shared_start`)."""
    status = {job: "skipped" for job in jobs if finished(job)}
    todo = [job for job in jobs if job not in status]
    for job in status:
        print(f"{job.run_dir}: finished, skipped", flush=True)
    starts = shared_start(todo, vary) if vary else []
    if starts:
        print(
            f"{len(starts)} shared start(s) first: " + ", ".join(str(s.run_dir) for s, _ in starts),
            flush=True,
        )
        pending = [s for s, _ in starts if not finished(s)]
        if pending:
            _run_all(pending, base_dir, *start_budget(workers, threads, len(pending)), run, {})
        for start, seeds in starts:
            _copy_start(start, seeds)
    return _run_all(todo, base_dir, workers, threads, run, status)


def _run_all(
    todo: list[Job], base_dir: Path, workers: int, threads: int, run, status: dict
) -> dict[Job, str]:
    if workers == 1:
        for job in todo:
            status[job] = _outcome(lambda job=job: run(job, base_dir, threads, False), job)
        return status
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the spawned workers read it before torch starts
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = {pool.submit(run, job, base_dir, threads, True): job for job in todo}
        for future in concurrent.futures.as_completed(futures):
            status[futures[future]] = _outcome(future.result, futures[future])
    return status


def _outcome(result, job: Job) -> str:
    try:
        text = f"ran in {result():.0f} s"
    except Exception as error:  # one cell's failure (a bad override value, a crash) leaves the others
        traceback.print_exc()  # a worker's traceback comes along as the cause
        text = f"failed: {type(error).__name__}: {error}"
    print(f"{job.run_dir}: {text}", flush=True)
    return text


def summarize(recipe, runs: dict[int, Path], baseline: str | None = None) -> str:
    evals = [(i, s) for i, s in enumerate(recipe.stages) if s.kind == "eval"]
    lines = [f"# {recipe.name}: {len(runs)} seeds ({', '.join(map(str, runs))})", ""]
    for index, stage in evals:
        results = {
            seed: json.loads((stage_dir(run, index, stage.name) / "eval.json").read_text())
            for seed, run in runs.items()
        }
        first = next(iter(results.values()))
        lines += [
            "| task | model | split | greedy accuracy % | mean@k % | parse rate % |",
            "|---|---|---|---|---|---|",
        ]
        for task, by_model in first.items():
            for model, by_split in by_model.items():
                for split, res in by_split.items():
                    per_seed = [r[task][model][split]["metrics"] for r in results.values()]
                    cells = [
                        spread([m[key]["value"] for m in per_seed], 100, 1)
                        for key in ("greedy_accuracy", f"mean@{res['k']}", "parse_rate")
                    ]
                    lines.append(f"| {task} | {model} | {split} | " + " | ".join(cells) + " |")
        lines.append("")
        if baseline and any(baseline in by_model for by_model in first.values()):
            lines += [
                f"Difference from {baseline}, same seed (points; mean and 95% t-interval over seeds):",
                "",
                "| task | model | split | greedy accuracy | mean@k |",
                "|---|---|---|---|---|",
            ]
            for task, by_model in first.items():
                for model, by_split in by_model.items():
                    if model == baseline or baseline not in by_model:
                        continue
                    for split in by_split:
                        cells = [
                            paired(
                                [
                                    _metrics(r[task][model][split], key)
                                    - _metrics(r[task][baseline][split], key)
                                    for r in results.values()
                                ]
                            )
                            for key in ("greedy_accuracy", "mean@k")
                        ]
                        lines.append(f"| {task} | {model} | {split} | " + " | ".join(cells) + " |")
            lines.append("")
    lines += rft_rounds(recipe, runs)
    lines += [
        "Compute per model stage (mean over seeds):",
        "",
        "| stage | kind | wall s | tokens |",
        "|---|---|---|---|",
    ]
    for index, stage in enumerate(recipe.stages):
        if stage.kind not in ("sft", "rl", "dpo", "kto"):
            continue
        seconds, tokens = [], []
        for run in runs.values():
            out = stage_dir(run, index, stage.name)
            seconds.append(json.loads((out / "stage.json").read_text())["seconds"])
            summary = json.loads((out / f"{stage.kind}.json").read_text())
            tokens.append(
                summary.get("tokens") or summary.get("sampled_tokens", 0) + summary.get("trained_tokens", 0)
            )
        what = "sampled + trained" if stage.kind == "rl" else "trained"
        lines.append(
            f"| {stage.name} | {stage.kind} | {statistics.mean(seconds):.0f} | {statistics.mean(tokens):,.0f} ({what}) |"
        )
    return "\n".join(lines) + "\n"


def rft_rounds(recipe, runs: dict[int, Path]) -> list[str]:
    """Per round of each rft stage: yield, kept samples and greedy test accuracy over seeds."""
    lines = []
    for index, stage in enumerate(recipe.stages):
        if stage.kind != "rft":
            continue
        per_seed = [
            json.loads((stage_dir(run, index, stage.name) / "rft.json").read_text())["rounds"]
            for run in runs.values()
        ]
        lines += [
            f"{stage.name}: per round ({len(runs)} seeds; round 0 is the starting model)",
            "",
            "| round | yield % | kept samples | greedy test accuracy % | parse rate % |",
            "|---|---|---|---|---|",
        ]
        for r in range(len(per_seed[0])):
            rounds = [seed_rounds[r] for seed_rounds in per_seed]
            kept = [x["kept"] for x in rounds if "kept" in x]
            cells = [
                spread([x["yield"] for x in rounds], 100, 1) if "yield" in rounds[0] else "–",
                f"{statistics.mean(kept):.0f} [{min(kept)}, {max(kept)}]" if kept else "–",
                spread([x["accuracy"] for x in rounds], 100, 1),
                spread([x["parse_rate"] for x in rounds], 100, 1),
            ]
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def eval_values(recipe, runs: dict[int, Path]) -> list[tuple[str, str, str, dict[str, list[float]]]]:
    """(task, model, split, {"greedy" | "parse": per-seed values}) over every eval stage."""
    rows = []
    for index, stage in enumerate(recipe.stages):
        if stage.kind != "eval":
            continue
        results = [
            json.loads((stage_dir(run, index, stage.name) / "eval.json").read_text()) for run in runs.values()
        ]
        for task, by_model in results[0].items():
            for model, by_split in by_model.items():
                for split in by_split:
                    per_seed = [r[task][model][split]["metrics"] for r in results]
                    values = {
                        "greedy": [m["greedy_accuracy"]["value"] for m in per_seed],
                        "parse": [m["parse_rate"]["value"] for m in per_seed],
                    }
                    rows.append((task, model, split, values))
    return rows


def grid_table(cells: dict[str, tuple[Any, dict[int, Path]]]) -> list[str]:
    """One row per cell x model x split: greedy accuracy and parse rate over seeds (in %)."""
    rows = [
        [cell, model, split, spread(v["greedy"], 100, 1), spread(v["parse"], 100, 1), str(len(runs))]
        for cell, (recipe, runs) in cells.items()
        for task, model, split, v in eval_values(recipe, runs)
    ]
    header = ["cell", "model", "split", "greedy accuracy %", "parse rate %", "seeds"]
    return table(header, rows)


def grid_plot(cells: dict[str, tuple[Any, dict[int, Path]]], path: Path, title: str) -> None:
    """Greedy accuracy per cell, one panel per split and one series per model: mean ± sample std
    over seeds as a bar with an error bar, each seed a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = {cell: eval_values(recipe, runs) for cell, (recipe, runs) in cells.items()}
    splits = list(dict.fromkeys(split for rows in values.values() for _, _, split, _ in rows))
    models = list(dict.fromkeys(model for rows in values.values() for _, model, _, _ in rows))
    names = list(cells)
    fig, axes = plt.subplots(
        1, len(splits), figsize=(max(6, 1.2 * len(names)) * len(splits) / 1.5, 4), squeeze=False
    )
    width = 0.8 / max(1, len(models))
    for ax, split in zip(axes[0], splits):
        for m, model in enumerate(models):
            for c, cell in enumerate(names):
                for _, mod, spl, v in values[cell]:
                    if (mod, spl) != (model, split):
                        continue
                    x = c - 0.4 + width * (m + 0.5)
                    seeds = [100 * g for g in v["greedy"]]
                    std = statistics.stdev(seeds) if len(seeds) > 1 else 0.0
                    ax.bar(
                        x,
                        statistics.mean(seeds),
                        width,
                        yerr=std,
                        capsize=3,
                        color=f"C{m}",
                        label=model if c == 0 else None,
                        alpha=0.8,
                    )
                    ax.plot([x] * len(seeds), seeds, "k.", markersize=4)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{split}")
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))  # an all-zero panel still shows 0 at the bottom
        ax.set_ylabel("greedy accuracy %")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vary", required=True, help="comma-separated stage names that take the seed")
    parser.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2", help="one axis of the grid (repeatable)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=V", help="an override for every cell (repeatable)"
    )
    parser.add_argument(
        "--workers", type=int, help="worker processes (default: the cores, at most one per job)"
    )
    parser.add_argument("--threads", type=int, help="torch threads per worker (default: cores // workers)")
    parser.add_argument("--out", help="markdown file for the tables")
    parser.add_argument("--plot", help="PNG of greedy accuracy per cell with the spread over seeds")
    parser.add_argument("--baseline", help="an eval's model name: per-seed differences from it")
    args = parser.parse_args()
    text = Path(args.recipe).read_text()
    base = Path(args.recipe).resolve().parent
    fixed = {}
    for spec in args.set:
        key, values = parse_axis(spec)
        if len(values) != 1:
            raise SystemExit(f"--set {spec!r}: one value (a grid axis is --grid)")
        fixed[key] = values[0]
    cells = expand_grid([parse_axis(s) for s in args.grid])
    root = parse_recipe(text).run_dir(Path.cwd())
    jobs, recipes = build_jobs(text, root, args.seeds, args.vary.split(","), cells, fixed)
    workers, threads = budget(args.workers, args.threads, os.cpu_count() or 1, len(jobs))
    print(
        f"{len(jobs)} jobs ({len(cells)} cells x {len(args.seeds)} seeds), {workers} workers x {threads} threads",
        flush=True,
    )
    status = run_sweep(jobs, base, workers, threads, vary=args.vary.split(","))
    done = {}
    for job in jobs:
        if not status[job].startswith("failed"):
            done.setdefault(job.cell, (recipes[job.cell], {}))[1][job.seed] = job.run_dir
    failed = [f"{job.run_dir}: {status[job]}" for job in jobs if status[job].startswith("failed")]
    parts = []
    if args.grid:
        parts += [
            f"# {parse_recipe(text).name}: {len(cells)} cells x seeds {args.seeds}",
            "",
            *grid_table(done),
            "",
        ]
        for cell, (recipe, runs) in done.items():
            parts += [f"## {cell}", "", summarize(recipe, runs, args.baseline)]
    else:
        parts += [summarize(*done[""], args.baseline)] if "" in done else []
    if failed:
        parts += ["Failed (rerun the same command to resume them):", "", *(f"- {f}" for f in failed), ""]
    report = "\n".join(parts)
    print(report)
    if args.out:
        atomic_write_text(args.out, report)
    if args.plot and done:
        grid_plot(done, Path(args.plot), parse_recipe(text).name)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
