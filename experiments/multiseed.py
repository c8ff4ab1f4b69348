"""Run a recipe over several seeds and report means with spread.

The stages named in --vary get the seed in their `train.seed` (and `data.seed` for SFT), every
other stage stays as written (so a shared start, e.g. the shipped base and a format SFT, is the
same for all seeds). Each seed runs into `<run_dir>/seed-<s>/` with the usual stage skipping, so
an interrupted experiment resumes. The table (mean ± sample std, [min, max] over seeds, and the
compute each model stage used) goes to stdout and to --out.

    python experiments/multiseed.py recipes/sft_vs_rl_general_points.yaml --seeds 0 1 2 \
        --vary sft_branch,rl_branch --out results/sft_vs_rl_general_points.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml
from tables import spread

from temper.atomic import atomic_write_text
from temper.recipe import parse_recipe
from temper.runner import run_recipe, stage_dir


def seeded_recipe(text: str, seed: int, vary: list[str]):
    data = yaml.safe_load(text)
    names = [s.get("name", s["kind"]) for s in data["stages"]]
    for name in vary:
        if name not in names:
            raise SystemExit(f"--vary: no stage named {name!r} (stages: {names})")
    for stage in data["stages"]:
        if stage.get("name", stage["kind"]) in vary:
            stage.setdefault("train", {})["seed"] = seed
            if stage["kind"] == "sft":
                stage.setdefault("data", {})["seed"] = 1000 + seed
    return parse_recipe(yaml.safe_dump(data, sort_keys=False)), yaml.safe_dump(data, sort_keys=False)


def summarize(recipe, runs: dict[int, Path]) -> str:
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
    lines += [
        "Compute per model stage (mean over seeds):",
        "",
        "| stage | kind | wall s | tokens |",
        "|---|---|---|---|",
    ]
    for index, stage in enumerate(recipe.stages):
        if stage.kind not in ("sft", "rl"):
            continue
        seconds, tokens = [], []
        for run in runs.values():
            out = stage_dir(run, index, stage.name)
            seconds.append(json.loads((out / "stage.json").read_text())["seconds"])
            summary = json.loads((out / f"{stage.kind}.json").read_text())
            tokens.append(
                summary.get("tokens") or summary.get("sampled_tokens", 0) + summary.get("trained_tokens", 0)
            )
        what = "trained" if stage.kind == "sft" else "sampled + trained"
        lines.append(
            f"| {stage.name} | {stage.kind} | {statistics.mean(seconds):.0f} | {statistics.mean(tokens):,.0f} ({what}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vary", required=True, help="comma-separated stage names that take the seed")
    parser.add_argument("--out", help="markdown file for the table")
    args = parser.parse_args()
    text = Path(args.recipe).read_text()
    base = Path(args.recipe).resolve().parent
    runs = {}
    for seed in args.seeds:
        recipe, seeded_text = seeded_recipe(text, seed, args.vary.split(","))
        run_dir = recipe.run_dir(Path.cwd()) / f"seed-{seed}"
        run_recipe(recipe, base, run_dir, seeded_text)
        runs[seed] = run_dir
    table = summarize(recipe, runs)
    print(table)
    if args.out:
        atomic_write_text(args.out, table)


if __name__ == "__main__":
    main()
