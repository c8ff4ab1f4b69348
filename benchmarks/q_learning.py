"""Tabular Q-learning on treasure_hunt: CPU time for 10,000 episodes, and the transfer comparison.

1. Speed: `train` for 10,000 episodes on FIXED_MAP (6x6, walls and traps, a 16-move detour past
   them), once per seed; process CPU seconds of the training loop (target <= 2 s), and whether the
   greedy policy then wins (and in how many steps, against the BFS optimum).
2. Transfer (the seed's 7-1/7-2 comparison), per seed s of 3: a table trained on one generated
   6x6 map, evaluated greedily on that map (seen), on `--unseen` other generated maps (transferred;
   the table maps a cell index to a move whatever the map), and, re-trained from scratch on each
   of the first `--retrain` of those maps, on each map it was trained on. Mean and spread over
   the seeds.

Timings are CPU time (time.process_time) of this process, which load on other cores inflates
less than wall time; the load average is printed beside them.

    PYTHONPATH=src python benchmarks/q_learning.py [--episodes 10000] [--unseen 100] [--retrain 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from temper.envs.gym_treasure_hunt import GymTreasureHunt
from temper.envs.q_learning import evaluate, train
from temper.envs.treasure_hunt import GridMap, generate_map, shortest_path

FIXED_MAP = GridMap.parse(
    """
    S.#...
    .^#.^.
    ..#.#.
    ....#.
    #.^.^.
    ..#^.$
    """
)
SEEDS = (0, 1, 2)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def spread(xs: list[float]) -> str:
    """mean ± sample std [min, max] over the seeds; seeds with a nan (no wins to count steps of)
    are left out and the count said."""
    kept = [x for x in xs if x == x]
    if not kept:
        return "n/a (no wins)"
    std = statistics.stdev(kept) if len(kept) > 1 else 0.0
    note = "" if len(kept) == len(xs) else f" ({len(kept)} of {len(xs)} seeds)"
    return f"{statistics.mean(kept):.3f} ± {std:.3f} [{min(kept):.3f}, {max(kept):.3f}]{note}"


def speed(episodes: int) -> None:
    env = GymTreasureHunt(FIXED_MAP)
    optimal = len(shortest_path(FIXED_MAP))
    print(f"## speed: {episodes} episodes on the fixed 6x6 map (optimum {optimal} moves)")
    print(FIXED_MAP.draw())
    print("| seed | CPU s | wall s | greedy wins | greedy steps | behaviour wins, last 1000 | env steps |")
    print("|---|---|---|---|---|---|---|")
    for seed in SEEDS:
        wall = time.perf_counter()
        table = train(env, episodes, seed)
        wall = time.perf_counter() - wall
        result = evaluate(table, env, [FIXED_MAP])
        print(
            f"| {seed} | {table.cpu_seconds:.2f} | {wall:.2f} | {result.success_rate:.0%} | {result.steps[0]} "
            f"| {table.wins[-1000:].mean():.1%} | {table.steps.sum()} |"
        )


def transfer(episodes: int, n_unseen: int, n_retrain: int) -> None:
    print(
        f"\n## transfer: trained on one generated 6x6 map, {episodes} episodes; {n_unseen} unseen maps, "
        f"{n_retrain} re-trained"
    )
    rows = {
        "seen": ([], []),
        "transferred": ([], []),
        "re-trained per map": ([], []),
        "BFS optimum (re-trained maps)": ([], []),
    }
    for seed in SEEDS:
        env = GymTreasureHunt(size=6)
        trained_on = generate_map(6, seed)
        unseen = [generate_map(6, 1_000_000 + 1000 * seed + i) for i in range(n_unseen)]
        assert trained_on not in unseen
        table = train(GymTreasureHunt(trained_on), episodes, seed)
        seen = evaluate(table, env, [trained_on])
        moved = evaluate(table, env, unseen)
        retrained = [
            evaluate(train(GymTreasureHunt(m), episodes, seed), env, [m]) for m in unseen[:n_retrain]
        ]
        won = [r.won[0] for r in retrained]
        steps = [r.steps[0] for r in retrained if r.won[0]]
        optimal = [len(shortest_path(m)) for m in unseen]
        for name, (rate, mean_steps) in {
            "seen": (seen.success_rate, seen.mean_steps),
            "transferred": (moved.success_rate, moved.mean_steps),
            "re-trained per map": (float(np.mean(won)), float(np.mean(steps)) if steps else float("nan")),
            "BFS optimum (re-trained maps)": (1.0, float(np.mean(optimal[:n_retrain]))),
        }.items():
            rows[name][0].append(rate)
            rows[name][1].append(mean_steps)
        print(
            f"seed {seed}: seen {seen.success_rate:.0%} in {seen.steps[0]} steps "
            f"(optimum {len(shortest_path(trained_on))}); transferred {moved.success_rate:.1%} "
            f"({sum(moved.won)}/{n_unseen}); re-trained {np.mean(won):.0%}, "
            f"optimum on the re-trained maps {np.mean(optimal[:n_retrain]):.2f}"
        )
    print(
        "\n| Q-table evaluated on | success rate, mean ± std [min, max] over 3 seeds | mean steps of wins |"
    )
    print("|---|---|---|")
    for name, (rates, steps) in rows.items():
        print(f"| {name} | {spread(rates)} | {spread(steps)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--unseen", type=int, default=100)
    parser.add_argument("--retrain", type=int, default=10)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    speed(args.episodes)
    transfer(args.episodes, args.unseen, args.retrain)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
