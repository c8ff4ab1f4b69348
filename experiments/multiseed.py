"""Run a recipe over several seeds and report means with spread.

The stages named in --vary get the seed in their `train.seed` (and `data.seed` for SFT, and the
`seed` of the pairs they generate: `data.generate` of dpo/kto, `data.pairs` of SFT), every
other stage stays as written (so a shared start, e.g. the shipped base and a format SFT, is the
same for all seeds). Each seed runs into `<run_dir>/seed-<s>/` with the usual stage skipping, so
an interrupted experiment resumes. The table (mean ± sample std, [min, max] over seeds, and the
compute each model stage used) goes to stdout and to --out. With --baseline MODEL, a second table
gives each other model's per-seed difference from MODEL (same seed, same task and split) with
its mean and 95% t-interval.

    python experiments/multiseed.py recipes/sft_vs_rl_general_points.yaml --seeds 0 1 2 \
        --vary sft_branch,rl_branch --out results/sft_vs_rl_general_points.md
"""

from __future__ import annotations

import argparse
import copy
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
    # a YAML alias (`generate: *pairs`) loads as one dict shared by the stages that name it: copy
    # each stage, so a seed given to a varied stage never reaches the others
    data["stages"] = [copy.deepcopy(stage) for stage in data["stages"]]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vary", required=True, help="comma-separated stage names that take the seed")
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--baseline", help="an eval's model name: per-seed differences from it")
    args = parser.parse_args()
    text = Path(args.recipe).read_text()
    base = Path(args.recipe).resolve().parent
    runs = {}
    for seed in args.seeds:
        recipe, seeded_text = seeded_recipe(text, seed, args.vary.split(","))
        run_dir = recipe.run_dir(Path.cwd()) / f"seed-{seed}"
        run_recipe(recipe, base, run_dir, seeded_text)
        runs[seed] = run_dir
    table = summarize(recipe, runs, args.baseline)
    print(table)
    if args.out:
        atomic_write_text(args.out, table)


if __name__ == "__main__":
    main()
