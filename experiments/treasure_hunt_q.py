"""The treasure-hunt comparison (issue 9 item 7): tabular Q-learning per map vs the LLM agent, on
the SAME seen and unseen maps.

The maps are the `treasure_hunt` task's (recipes/agent_treasure_hunt.yaml's options): the first
`--maps` problems of `task.sample("train", ...)` are the seen maps (those SFT and RL trained on),
of `task.sample("test", ...)` the unseen ones (a disjoint seed range, same size), with the task's
step limit. Per seed s:

- Q-learning (temper.envs.q_learning, `--episodes` per map, behaviour seed s):
  seen: a table trained on seen map i, played greedily on map i;
  transferred: each of those tables played on every unseen map (its state, a cell index, carries
  nothing about the new map's walls, traps or treasure);
  re-trained: a fresh table trained on unseen map j, played on map j.
- LLM agent: the `sft` and `rl` models of `<runs>/seed-s` (experiments/multiseed.py with
  `--vary sft,rl`), one greedy episode per map (`temper.evaluate.evaluate`, k = 0), on the seen,
  the unseen and `--maps` ood maps (larger; no Q-table applies to them: its states are another
  map's cells).

Success rate = share of maps won; mean steps = mean episode length over the won maps (the BFS
optimum beside it). Across seeds: mean ± sample std [min, max], and a 95% Wilson interval on the
success rate over all seeds' episodes pooled (the maps are the same for every seed, so that
interval says how precisely these maps were measured, not how much a new seed would move).

    PYTHONPATH=src python experiments/treasure_hunt_q.py --runs runs/agent_treasure_hunt \
        --seeds 0 1 2 --maps 200 --out results/treasure_hunt.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import yaml

from temper.atomic import atomic_write_text
from temper.catalog import make_recipe_task
from temper.envs.gym_treasure_hunt import GymTreasureHunt
from temper.envs.q_learning import evaluate as q_evaluate
from temper.envs.q_learning import train as q_train
from temper.envs.treasure_hunt import GridMap
from temper.stats import wilson_interval

MAP_SEED = 1234  # which problems of each split (the eval stage's default seed)


def grid_of(problem) -> GridMap:
    return GridMap(tuple(problem.data["rows"]), tuple(problem.data["start"]))


def q_learning(seen, unseen, episodes: int, seed: int) -> dict[str, tuple[list[bool], list[int]]]:
    """{row: (won per episode, steps per episode)} for seen / transferred / re-trained."""
    out: dict[str, tuple[list[bool], list[int]]] = {
        k: ([], []) for k in ("seen", "transferred", "re-trained")
    }

    def add(row, ev):
        out[row][0].extend(ev.won)
        out[row][1].extend(ev.steps)

    limit = seen[0].data["max_steps"]
    unseen_grids = [grid_of(p) for p in unseen]
    for problem in seen:
        grid = grid_of(problem)
        env = GymTreasureHunt(grid, max_steps=limit)
        table = q_train(env, episodes, seed)
        add("seen", q_evaluate(table, env, [grid]))
        add("transferred", q_evaluate(table, env, unseen_grids))
    for grid in unseen_grids:
        env = GymTreasureHunt(grid, max_steps=limit)
        add("re-trained", q_evaluate(q_train(env, episodes, seed), env, [grid]))
    return out


def llm(run: Path, stage: str, task, split: str, n: int) -> tuple[list[bool], list[int]]:
    """Greedy episodes of the model saved by `stage` of `run` on the split's first n maps:
    (won per episode, steps) where the steps of won episodes are their mean (the episode summary
    holds sums: signals.won_steps / signals.treasure) and lost ones count 0 (unused)."""
    from temper.evaluate import evaluate
    from temper.models import load_model, load_tokenizer
    from temper.rollout import HFSampler

    folder = next(run.glob(f"[0-9][0-9]-{stage}")) / "model"
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    result = evaluate(
        HFSampler(model, tokenizer), tokenizer, task, split, n_problems=n, seed=MAP_SEED, k=0,
        max_new_tokens=32,
    )  # fmt: skip
    episodes = result["episodes"]
    wins = round(episodes["signals"].get("treasure", 0.0) * episodes["episodes"])
    mean_steps = episodes["signals"].get("won_steps", 0.0) / max(
        episodes["signals"].get("treasure", 0.0), 1e-9
    )
    return [True] * wins + [False] * (episodes["episodes"] - wins), [mean_steps] * wins + [0] * (
        episodes["episodes"] - wins
    )


def cached(folder: Path, key: str, compute, *args):
    """`compute(*args)` (a JSON-able value), saved as folder/key.json and read back on later calls, so
    seeds can run in parallel processes (`--seeds 0`, `--seeds 1`, ...) and a last call with all
    seeds only builds the table."""
    path = folder / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    value = compute(*args)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(value))
    return value


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    kept = [v * scale for v in values if v == v]
    if not kept:
        return "n/a"
    std = statistics.stdev(kept) if len(kept) > 1 else 0.0
    return f"{statistics.mean(kept):.{digits}f} ± {std:.{digits}f} [{min(kept):.{digits}f}, {max(kept):.{digits}f}]"


def row(name: str, per_seed: list[tuple[list[bool], list[int]]]) -> str:
    rates = [sum(w) / len(w) for w, _ in per_seed]
    steps = [statistics.mean([s for x, s in zip(w, st) if x]) if any(w) else math.nan for w, st in per_seed]
    pooled = [x for w, _ in per_seed for x in w]
    lo, hi = wilson_interval(sum(pooled), len(pooled))
    return (
        f"| {name} | {spread(rates, 100)} | [{100 * lo:.1f}, {100 * hi:.1f}] (n={len(pooled)}) "
        f"| {spread(steps, digits=2)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/agent_treasure_hunt.yaml")
    parser.add_argument(
        "--runs", help="experiments/multiseed.py's run folder (holds seed-<s>/); omit for Q only"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--maps", type=int, default=200, help="seen, unseen and ood maps each")
    parser.add_argument("--episodes", type=int, default=1000, help="Q-learning episodes per map")
    parser.add_argument("--out", help="markdown file for the table")
    args = parser.parse_args()
    options = yaml.safe_load(Path(args.recipe).read_text())["tasks"]["treasure_hunt"]
    task = make_recipe_task("treasure_hunt", options)
    seen, unseen, ood = (task.sample(s, args.maps, MAP_SEED) for s in ("train", "test", "ood"))
    optimum = {
        s: statistics.mean(len(p.data["path"]) for p in ps)
        for s, ps in (("seen", seen), ("unseen", unseen), ("ood", ood))
    }
    rows: dict[tuple[str, str], list] = {}
    cache = Path("runs/treasure_hunt_compare")  # results per (agent, seed), reused by later calls
    t0 = time.process_time()
    for seed in args.seeds:
        key = f"q-seed{seed}-maps{args.maps}-episodes{args.episodes}"
        q = cached(cache, key, q_learning, seen, unseen, args.episodes, seed)
        rows.setdefault(("Q-learning, trained on the map", "seen"), []).append(q["seen"])
        rows.setdefault(("Q-learning, transferred (table of another map)", "unseen"), []).append(
            q["transferred"]
        )
        rows.setdefault(("Q-learning, re-trained on the map", "unseen"), []).append(q["re-trained"])
    q_cpu = time.process_time() - t0
    timings = {}
    if args.runs:
        for seed in args.seeds:
            run = Path(args.runs) / f"seed-{seed}"
            for stage in ("sft", "rl"):
                stage_hash = json.loads(next(run.glob(f"[0-9][0-9]-{stage}/stage.json")).read_text())["hash"]
                for split, label in (("train", "seen"), ("test", "unseen"), ("ood", "ood")):
                    start = time.perf_counter()
                    key = f"llm-{stage}-{stage_hash}-{split}-maps{args.maps}"
                    result = cached(cache, key, llm, run, stage, task, split, args.maps)
                    rows.setdefault((f"LLM agent after {stage}", label), []).append(result)
                    timings[(seed, stage, split)] = time.perf_counter() - start
    lines = [
        f"# treasure_hunt: Q-learning vs the LLM agent, {len(args.seeds)} seeds ({', '.join(map(str, args.seeds))})",
        "",
        f"{args.maps} seen (train-split), {args.maps} unseen (test-split) and {args.maps} ood "
        f"(larger) maps of the task in `{args.recipe}`; BFS optimum: {optimum['seen']:.2f} steps "
        f"(seen), {optimum['unseen']:.2f} (unseen), {optimum['ood']:.2f} (ood). Q-learning: {args.episodes} episodes per map"
        + (f" ({q_cpu:.0f} s CPU for these seeds). " if q_cpu >= 1 else " (cached results). ")
        + "Success: mean ± std [min, max] over seeds, and a 95% Wilson interval over all seeds' episodes. "
        "Steps: mean over won episodes.",
        "",
        "| agent | maps | success % | 95% CI | mean steps (won) |",
        "|---|---|---|---|---|",
    ]
    for split in ("seen", "unseen", "ood"):
        lines += [row(f"{name} | {label}", per) for (name, label), per in rows.items() if label == split]
    timings = {k: v for k, v in timings.items() if v >= 1}  # cached ones took no time
    if timings:
        lines += [
            "",
            "LLM evaluation wall seconds: "
            + json.dumps({"/".join(map(str, k)): round(v) for k, v in timings.items()}),
        ]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        atomic_write_text(args.out, table)


if __name__ == "__main__":
    main()
