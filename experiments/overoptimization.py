"""Reward over-optimization against a gold verifier: proxy and gold reward against sqrt(KL).

Runs `recipes/overoptimization.yaml` (or another recipe of the same shape) for several seeds and
draws, for each optimizer and proxy reward model, the proxy's reward (the reward model's score)
and the gold reward (the task's verifier: the share of correct answers) against sqrt(KL to the
starting policy), as Gao et al. 2022 ("Scaling Laws for Reward Model Overoptimization", fig. 1):

* an `rl` stage logs, every step, the proxy (`reward/reward_model`), the gold (`reward/gold`,
  never trained on) and the KL per sequence to the reference (`kl_ref_seq`: the k1 estimate
  sum_t log pi(y_t) / pi_ref(y_t) averaged over the step's samples). Steps are averaged in
  windows of `--window`, so one run gives one curve over KL (checkpoints along training);
* an `eval` stage with `best_of_n` ranked by a reward model gives, per N, the pick's expected
  proxy score (`score`) and its gold (`accuracy`), at the analytic KL log N - (N - 1)/N.

Each point is the mean over seeds, with the sample std as the spread (x and y). The seed goes to
the stages named in --vary (their pairs, training and sampling) and to every eval stage's sampling
seed; the stages before the first varied one (the shipped base, the SFT) are run once and copied
into the other seeds' folders, where the runner checks their hash and skips them.

    python experiments/overoptimization.py recipes/overoptimization.yaml --seeds 0 1 2 \
        --out results/overoptimization.md --plot results/overoptimization.png
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
from pathlib import Path

import yaml
from multiseed import seeded_recipe

from temper.atomic import atomic_write_text
from temper.runner import run_recipe

VARY = "rm_small,rm_large,ppo,ppo_kl,ppo_large"

Curve = list[dict[str, float]]  # points {"kl", "proxy", "gold"}, KL in nats per sequence


def rl_curve(rows: list[dict], window: int) -> Curve:
    """An rl stage's metrics rows -> the first step alone (sampled before any update: the
    starting policy, KL 0 up to the estimate's noise), then one point per `window` consecutive
    steps: the mean KL per sequence, proxy and gold of those steps. Rows without the three keys
    (eval-only rows) are skipped; a last window shorter than `window` is kept (the end of training)."""
    steps = [r for r in rows if {"kl_ref_seq", "reward/reward_model", "reward/gold"} <= set(r)]
    out = []
    for chunk in [steps[:1]] + [steps[i : i + window] for i in range(1, len(steps), window)]:
        out.append(
            {
                "kl": statistics.mean(r["kl_ref_seq"] for r in chunk),
                "proxy": statistics.mean(r["reward/reward_model"] for r in chunk),
                "gold": statistics.mean(r["reward/gold"] for r in chunk),
            }
        )
    return out


def bon_curve(best_of_n: dict) -> Curve:
    """An eval result's `best_of_n` block (ranked by a reward model) -> one point per N."""
    return [
        {"n": n, "kl": kl, "proxy": score["value"], "gold": acc["value"]}
        for n, kl, score, acc in zip(
            best_of_n["n"], best_of_n["kl"], best_of_n["score"], best_of_n["accuracy"], strict=True
        )
    ]


def sqrt_kl(kl: float) -> float:
    """sqrt of a KL estimate; the k1 estimate of a tiny KL can come out slightly negative, read as 0."""
    return math.sqrt(max(kl, 0.0))


def over_seeds(curves: list[Curve]) -> list[dict[str, float]]:
    """Point-wise mean and sample std over seeds of sqrt(KL), proxy, proxy gain (proxy minus the
    seed's first point) and gold (curves of equal length; std 0 for one seed)."""
    if len({len(c) for c in curves}) != 1:
        raise ValueError(f"curves of different lengths over seeds: {[len(c) for c in curves]}")
    out = []
    for points in zip(*curves, strict=True):
        row = {}
        for key, values in (
            ("x", [sqrt_kl(p["kl"]) for p in points]),
            ("proxy", [p["proxy"] for p in points]),
            # a Bradley-Terry reward is defined up to an offset, which differs between seeds' reward
            # models: the proxy's rise from the curve's start is what compares across seeds
            ("gain", [p["proxy"] - c[0]["proxy"] for p, c in zip(points, curves, strict=True)]),
            ("gold", [p["gold"] for p in points]),
        ):
            row[key] = statistics.mean(values)
            row[key + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        if "n" in points[0]:
            row["n"] = points[0]["n"]
        out.append(row)
    return out


def peak(curve: list[dict[str, float]]) -> dict[str, float]:
    """Where the mean gold peaks on a mean curve, and how the proxy moves past it: the peak's
    index, sqrt(KL), gold and proxy; the gold and proxy at the start and at the last point."""
    i = max(range(len(curve)), key=lambda j: curve[j]["gold"])
    first, last = curve[0], curve[-1]
    return {
        "index": i,
        "x": curve[i]["x"],
        "gold": curve[i]["gold"],
        "proxy": curve[i]["proxy"],
        "gold_start": first["gold"],
        "gold_end": last["gold"],
        "proxy_start": first["proxy"],
        "proxy_end": last["proxy"],
        "x_end": last["x"],
    }


def seed_text(text: str, seed: int, vary: list[str]) -> str:
    """The recipe for one seed: `multiseed.seeded_recipe` for the varied stages, and every eval
    stage's sampling seed (eval stages have no train block for it to set)."""
    data = yaml.safe_load(text)
    for stage in data["stages"]:
        if stage["kind"] == "eval":
            stage["seed"] = stage.get("seed", 1234) + seed
    return seeded_recipe(yaml.safe_dump(data, sort_keys=False), seed, vary)[1]


def copy_shared(recipe, first: Path, run_dir: Path, vary: list[str]) -> None:
    """Copy the finished stage folders before the first varied stage from the first seed's run:
    they are the same for every seed (the runner re-checks their hash, and reruns on a mismatch)."""
    from temper.runner import stage_dir

    for i, stage in enumerate(recipe.stages):
        if stage.name in vary:
            return
        src, dst = stage_dir(first, i, stage.name), stage_dir(run_dir, i, stage.name)
        if (src / "stage.json").is_file() and not dst.exists():
            shutil.copytree(src, dst)


def stage_folder(run: Path, name: str) -> Path:
    found = sorted(run.glob(f"[0-9][0-9]-{name}"))
    if not found:
        raise SystemExit(f"{run}: no stage folder named *-{name}")
    return found[0]


def collect(runs: dict[int, Path], recipe, window: int) -> dict[str, list[Curve]]:
    """Per-seed curves of every rl stage and every eval stage with best_of_n, by stage name."""
    curves: dict[str, list[Curve]] = {}
    for stage in recipe.stages:
        for run in runs.values():
            folder = stage_folder(run, stage.name)
            if stage.kind == "rl":
                rows = [
                    json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()
                ]
                curves.setdefault(stage.name, []).append(rl_curve(rows, window))
            elif stage.kind == "eval" and stage.best_of_n is not None:
                result = json.loads((folder / "eval.json").read_text())
                by_model = next(iter(result.values()))  # its one task
                model = stage.models[-1] if stage.models else list(by_model)[-1]
                res = next(iter(by_model[model].values()))  # its one split
                curves.setdefault(stage.name, []).append(bon_curve(res["best_of_n"]))
    return curves


def reward_models(runs: dict[int, Path], recipe) -> list[str]:
    lines = ["| reward model | train pairs | held-out pairs | held-out accuracy, untrained -> trained | held-out ECE |", "|---|---|---|---|---|"]  # fmt: skip
    for stage in recipe.stages:
        if stage.kind != "reward_model":
            continue
        s = [
            json.loads((stage_folder(r, stage.name) / "reward_model.json").read_text()) for r in runs.values()
        ]
        pairs = [x["data"]["rows"] for x in s]
        held = [x["held_out_pairs"] for x in s]
        before = [x["held_out_accuracy_initial"] for x in s]
        after = [x["held_out_accuracy"] for x in s]
        ece = [x["calibration"]["ece"] for x in s]
        lines.append(
            f"| {stage.name} | {statistics.mean(pairs):.0f} {pairs} | {statistics.mean(held):.0f} | "
            f"{100 * statistics.mean(before):.1f}% -> {100 * statistics.mean(after):.1f}% "
            f"(per seed {', '.join(f'{100 * a:.1f}' for a in after)}) | {statistics.mean(ece):.3f} |"
        )
    return lines


def timing(runs: dict[int, Path], recipe) -> list[str]:
    lines = ["| stage | kind | seconds per seed (mean [min, max]) |", "|---|---|---|"]
    for stage in recipe.stages:
        secs = []
        for r in runs.values():
            marker = json.loads((stage_folder(r, stage.name) / "stage.json").read_text())
            secs.append(marker.get("seconds", 0.0))
        lines.append(
            f"| {stage.name} | {stage.kind} | {statistics.mean(secs):.0f} [{min(secs):.0f}, {max(secs):.0f}] |"
        )
    return lines


def summarize(means: dict[str, list[dict[str, float]]], window: int) -> list[str]:
    lines = []
    for name, curve in means.items():
        p = peak(curve)
        where = (
            "at the start (never above it)"
            if p["index"] == 0
            else (
                "at the last point (still rising)"
                if p["index"] == len(curve) - 1
                else f"at point {p['index']}"
            )
        )
        lines += [
            f"**{name}**: gold peaks {where}: {100 * p['gold']:.1f}% at sqrt(KL) {p['x']:.2f} "
            f"(start {100 * p['gold_start']:.1f}%, end {100 * p['gold_end']:.1f}% at sqrt(KL) {p['x_end']:.2f}); "
            f"proxy {p['proxy_start']:.3f} -> {p['proxy']:.3f} at the gold peak -> {p['proxy_end']:.3f} at the end "
            f"(gain {curve[-1]['gain']:+.3f} ± {curve[-1]['gain_std']:.3f} over seeds).",
            "",
            "| point | sqrt(KL) | proxy (RM score) | proxy gain from the start | gold (verifier accuracy %) |",
            "|---|---|---|---|---|",
        ]
        for i, r in enumerate(curve):
            label = (
                f"N={r['n']}"
                if "n" in r
                else ("step 1" if i == 0 else f"steps {2 + (i - 1) * window}-{1 + i * window}")
            )
            lines.append(
                f"| {label} | {r['x']:.2f} ± {r['x_std']:.2f} | {r['proxy']:.3f} ± {r['proxy_std']:.3f} | "
                f"{r['gain']:+.3f} ± {r['gain_std']:.3f} | "
                f"{100 * r['gold']:.1f} ± {100 * r['gold_std']:.1f} |"
            )
        lines.append("")
    return lines


def plot(
    means: dict[str, list[dict[str, float]]], panels: list[list[str]], titles: list[str], path: Path
) -> None:
    """One panel per group of curves; in each, proxy on the left axis (solid) and gold on the
    right axis (dashed) against sqrt(KL), mean over seeds with a band of one std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, names, title in zip(axes[0], panels, titles, strict=True):
        gold_ax = ax.twinx()
        for j, name in enumerate(names):
            c = means[name]
            x = [r["x"] for r in c]
            color = colors[j % len(colors)]
            for a, key, style in ((ax, "gain", "-"), (gold_ax, "gold", "--")):
                y = [r[key] for r in c]
                s = [r[key + "_std"] for r in c]
                a.plot(
                    x,
                    y,
                    style,
                    marker="o",
                    ms=3,
                    color=color,
                    label=f"{name} {'proxy' if key == 'gain' else key}",
                )
                a.fill_between(
                    x, [u - v for u, v in zip(y, s)], [u + v for u, v in zip(y, s)], color=color, alpha=0.12
                )
        ax.set_xlabel("sqrt(KL to the SFT policy), nats^0.5")
        ax.set_ylabel("proxy: reward-model score minus its start (solid)")
        gold_ax.set_ylabel("gold: verifier accuracy (dashed)")
        ax.set_title(title, fontsize=10)
        handles = ax.get_legend_handles_labels()[0] + gold_ax.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vary", default=VARY, help="comma-separated stage names that take the seed")
    parser.add_argument("--window", type=int, default=4, help="rl steps averaged into one point")
    parser.add_argument("--out", help="markdown file for the tables")
    parser.add_argument("--plot", help="png for the chart")
    parser.add_argument("--no-run", action="store_true", help="summarize the seeds' folders as they are")
    args = parser.parse_args()
    text = Path(args.recipe).read_text()
    base = Path(args.recipe).resolve().parent
    vary = args.vary.split(",")
    runs: dict[int, Path] = {}
    for seed in args.seeds:
        seeded = seed_text(text, seed, vary)
        from temper.recipe import parse_recipe

        recipe = parse_recipe(seeded)
        run_dir = recipe.run_dir(Path.cwd()) / f"seed-{seed}"
        if not args.no_run:
            if runs:
                copy_shared(recipe, next(iter(runs.values())), run_dir, vary)
            run_recipe(recipe, base, run_dir, seeded)
        runs[seed] = run_dir
    curves = collect(runs, recipe, args.window)
    means = {name: over_seeds(c) for name, c in curves.items()}
    lines = [
        f"# {recipe.name}: proxy vs gold reward against sqrt(KL), {len(runs)} seeds ({', '.join(map(str, runs))})",
        "",
    ]
    lines += (
        reward_models(runs, recipe)
        + [""]
        + summarize(means, args.window)
        + ["Stage seconds (wall):", ""]
        + timing(runs, recipe)
    )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        atomic_write_text(args.out, table)
    if args.plot:
        small = [n for n in means if n in ("ppo", "ppo_kl", "bon_small")]
        large = [n for n in means if n in ("ppo_large", "bon_large")]
        panels = [p for p in (small, large) if p] or [list(means)]
        titles = ["proxy RM on the limited pair set", "proxy RM on 4x the pairs (mitigation)"][: len(panels)]
        plot(means, panels, titles, Path(args.plot))


if __name__ == "__main__":
    main()
