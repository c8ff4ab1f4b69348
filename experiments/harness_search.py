"""Harness search over seeds (issue 28 item 4): does a found harness beat the default one, with
the same frozen model, on held-out problems?

Per seed s, the recipe runs into `<runs>/seed-<s>/` with its SFT stage seeded s (the frozen
model differs per seed: `multiseed.seeded_recipe --vary sft`) and the harness_search stage's
`seed` s (other train, selection and final problems). The table reads each seed's
`harness_search.json`: the default's and the kept harness's greedy accuracy on the final
held-out problems (which neither the search nor the selection saw), mean ± sample std [min, max]
over seeds, and the paired difference kept - default per seed with its 95% t-interval
(`tables.paired`); then every seed's candidates with their train and selection accuracy.

    PYTHONPATH=src python experiments/harness_search.py recipes/harness_search_treasure_hunt.yaml \\
        --seeds 0 1 2 --runs runs/harness_search --out results/harness_search_treasure_hunt.md

One process, one torch thread (the machine's other core stays free); a seed whose folder holds
this recipe and every stage's marker is not rerun.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from multiseed import Job, finished, run_job, seeded_recipe
from tables import paired, spread, stage, table

from temper.atomic import atomic_write_text


def run_seeds(recipe: Path, seeds: list[int], runs: Path) -> dict[int, float]:
    """Run every unfinished seed; -> wall seconds per seed run now."""
    text = recipe.read_text()
    took = {}
    for seed in seeds:
        _, seeded = seeded_recipe(text, seed, ["sft"], {"stages.harness_search.seed": seed})
        job = Job("", seed, seeded, runs / f"seed-{seed}")
        if not finished(job):
            took[seed] = run_job(job, recipe.parent.resolve(), threads=1, log=True)
    return took


def summarize(runs: Path, seeds: list[int], took: dict[int, float]) -> str:
    found = {
        s: json.loads((stage(runs / f"seed-{s}", "harness_search") / "harness_search.json").read_text())
        for s in seeds
    }
    first = next(iter(found.values()))
    default = [found[s]["final"]["default"]["accuracy"]["value"] for s in seeds]
    kept = [found[s]["final"]["best"]["accuracy"]["value"] for s in seeds]
    n = first["problems"]
    lines = [
        f"# Harness search on {first['task']}: default vs kept harness, {len(seeds)} seeds ({', '.join(map(str, seeds))})",
        "",
        f"Frozen model: the recipe's SFT model (seeded per seed). Each seed: {n[0]} train problems per candidate, "
        f"the best 3 on train compared on {n[1]} held-out ({first['held_out_split']}) problems, the default and "
        f"the kept harness reported on {n[2]} other held-out problems (greedy, one episode per map).",
        "",
        *table(
            ["harness", "final held-out accuracy % (mean ± std [min, max])"],
            [["default", spread(default, 100, 1)], ["kept", spread(kept, 100, 1)]],
        ),
        "",
        f"Kept - default, same seed (points; per-seed differences, 95% t-interval): {paired(default, kept, 100, 1)}",
        "",
    ]
    for s in seeds:
        f = found[s]
        lines += [
            f"Seed {s}: kept `{f['best']}` ({', '.join(f'{k}={v}' for k, v in f['best_settings'].items())})",
            "",
        ]
        rows = []
        for c in f["candidates"]:
            train = f"{100 * c['train']['accuracy']['value']:.1f}" if c["train"] else "refused"
            held = f"{100 * c['held_out']['accuracy']['value']:.1f}" if c["held_out"] else ""
            rows.append([c["folder"], train, held])
        lines += [*table(["candidate", "train acc %", "selection acc %"], rows), ""]
    if took:
        lines.append(f"Wall time per seed run now (s): {', '.join(f'{s}: {t:.0f}' for s, t in took.items())}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", type=Path, default=Path("runs/harness_search"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    start = time.perf_counter()
    took = run_seeds(args.recipe, args.seeds, args.runs.resolve())
    text = summarize(args.runs.resolve(), args.seeds, took)
    text += f"\nTotal wall time of this invocation: {time.perf_counter() - start:.0f} s\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
