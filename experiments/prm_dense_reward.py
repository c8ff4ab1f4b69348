"""A process reward model as a dense PPO reward vs the outcome alone, on GeneralPoints
(recipes/prm_dense_reward.yaml): the gold (verifier) reward and the PRM's scores along training,
and the verifier's eval of each arm, over seeds.

Runs the recipe (finished stages are skipped), with, for each extra seed s, copies of the two PPO
stages named `<name>_s<s>` that train with seed s (their sampling too), placed before the eval
stage so that it evaluates them all; SFT and the PRM are shared. Then reads each PPO stage's
metrics.jsonl and the eval stage's eval.json:

- gold: reward/gold, the verifier's reward of every training sample (never the PRM's);
- PRM: reward/process_reward_model (the summed step scores, the dense return) and prm/min_step
  (the weakest step's score), logged in both arms (at weight 0 in the outcome arm);
- greedy test accuracy from the stage's periodic evals, and the eval stage's greedy accuracy and
  mean@k on the test split (its own problems and seed).

    python experiments/prm_dense_reward.py recipes/prm_dense_reward.yaml --seeds 0 1 2 \
        --out results/prm_dense_reward.md
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path

import yaml

from temper.atomic import atomic_write_text
from temper.recipe import parse_recipe
from temper.runner import run_recipe, stage_dir

ARMS = ("ppo_outcome", "ppo_prm")
LABEL = {"ppo_outcome": "outcome only", "ppo_prm": "outcome + dense PRM (w 0.5)"}
TASK = "general_points"


def seeded(data: dict, seeds: list[int]) -> dict:
    """The recipe with, for each seed but 0, a copy of each PPO stage training with it, before eval."""
    data = copy.deepcopy(data)
    stages = data["stages"]
    at = next(i for i, s in enumerate(stages) if s["kind"] == "eval")
    extra = []
    for seed in seeds:
        if seed == 0:
            continue
        for stage in stages:
            if stage.get("name") in ARMS:
                twin = copy.deepcopy(stage)
                twin["name"] = f"{stage['name']}_s{seed}"
                twin["train"]["seed"] = seed
                extra.append(twin)
    data["stages"] = stages[:at] + extra + stages[at:]
    return data


def name(arm: str, seed: int) -> str:
    return arm if seed == 0 else f"{arm}_s{seed}"


def rows(run: Path, names: list[str], stage: str) -> list[dict]:
    folder = stage_dir(run, names.index(stage), stage)
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def window(history: list[dict], key: str, first: bool, n: int = 5) -> float:
    values = [r[key] for r in history if key in r]
    return statistics.mean(values[:n] if first else values[-n:])


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    m = statistics.mean(values) * scale
    if len(values) < 2:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def summarize(run: Path, recipe, seeds: list[int], plot: Path | None) -> str:
    names = [s.name for s in recipe.stages]
    evals = json.loads((stage_dir(run, len(names) - 1, names[-1]) / "eval.json").read_text())[TASK]
    metrics = {(arm, s): rows(run, names, name(arm, s)) for arm in ARMS for s in seeds}
    k = recipe.stages[-1].k
    lines = [
        f"# A process reward model as a dense PPO reward vs the outcome alone ({TASK}, seeds {seeds})",
        "",
        "| arm | gold, first 5 steps | gold, last 5 steps | PRM min step, first 5 / last 5 | PRM return (sum of steps), last 5 "
        f"| KL to SFT per sequence, last 5 | greedy test acc. (eval stage) | mean@{k} test (eval stage) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sft = evals["sft"]["test"]["metrics"]
    lines.append(
        f"| SFT (start) | | | | | | {100 * sft['greedy_accuracy']['value']:.1f} "
        f"| {100 * sft[f'mean@{k}']['value']:.1f} |"
    )
    for arm in ARMS:
        runs = [metrics[arm, s] for s in seeds]
        ev = [evals[name(arm, s)]["test"]["metrics"] for s in seeds]
        lines.append(
            f"| {LABEL[arm]} | {spread([window(h, 'reward/gold', True) for h in runs], 100, 1)} "
            f"| {spread([window(h, 'reward/gold', False) for h in runs], 100, 1)} "
            f"| {spread([window(h, 'prm/min_step', True) for h in runs])} / "
            f"{spread([window(h, 'prm/min_step', False) for h in runs])} "
            f"| {spread([window(h, 'reward/process_reward_model', False) for h in runs])} "
            f"| {spread([window(h, 'kl_ref_seq', False) for h in runs], 1, 3)} "
            f"| {spread([e['greedy_accuracy']['value'] for e in ev], 100, 1)} "
            f"| {spread([e[f'mean@{k}']['value'] for e in ev], 100, 1)} |"
        )
    lines += [
        "",
        "Gold and accuracies in %; gold is the verifier's reward of the training samples (train split, "
        "temperature 1), ± the std over seeds. The eval stage grades "
        f"{recipe.stages[-1].n_problems} test problems, greedy and k = {k} samples.",
        "",
        f"Periodic greedy test accuracy ({recipe.stages[names.index('ppo_outcome')].train.eval_problems} "
        "problems), % by step:",
        "",
    ]
    steps = sorted({r["step"] for h in metrics.values() for r in h if f"eval/{TASK}/accuracy" in r})
    lines.append("| arm | " + " | ".join(f"step {s}" for s in steps) + " |")
    lines.append("|---|" + "---|" * len(steps))
    for arm in ARMS:
        cells = []
        for step in steps:
            vals = [r[f"eval/{TASK}/accuracy"] for s in seeds for r in metrics[arm, s] if r["step"] == step]
            cells.append(spread(vals, 100, 1))
        lines.append(f"| {LABEL[arm]} | " + " | ".join(cells) + " |")
    for s in seeds:
        secs = {
            arm: json.loads(
                (stage_dir(run, names.index(name(arm, s)), name(arm, s)) / "stage.json").read_text()
            )["seconds"]
            for arm in ARMS
        }
        lines.append("")
        lines.append(f"- seed {s}: wall seconds " + ", ".join(f"{arm} {v:.0f}" for arm, v in secs.items()))
    if plot is not None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 3.4), layout="constrained")
        axes = fig.subplots(1, 3)
        for arm, color in zip(ARMS, ("tab:blue", "tab:orange"), strict=True):
            for key, ax in zip(
                ("reward/gold", "prm/min_step", "reward/process_reward_model"), axes, strict=True
            ):
                for j, s in enumerate(seeds):
                    h = metrics[arm, s]
                    ax.plot([r["step"] for r in h], [r[key] for r in h], color=color, alpha=0.8 if len(seeds) == 1 else 0.4,
                            label=LABEL[arm] if j == 0 else None)  # fmt: skip
                ax.set_title({"reward/gold": "gold (verifier) reward", "prm/min_step": "PRM: weakest step",
                              "reward/process_reward_model": "PRM: sum of step scores"}[key])  # fmt: skip
                ax.set_xlabel("PPO step")
        axes[0].legend(fontsize=8)
        fig.savefig(plot, dpi=110)
        lines += ["", f"![gold and PRM scores along PPO]({plot.name})"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-run", action="store_true", help="only summarize finished stages")
    args = ap.parse_args()
    data = seeded(yaml.safe_load(args.recipe.read_text()), args.seeds)
    text = yaml.safe_dump(data, sort_keys=False)
    base = args.recipe.resolve().parent
    recipe = parse_recipe(text, base_dir=base)
    run = recipe.run_dir(Path.cwd(), base)
    if not args.no_run:
        run_recipe(recipe, base, run, text)
    plot = args.out.with_suffix(".png") if args.out else None
    summary = summarize(run, recipe, args.seeds, plot)
    print(summary)
    if args.out:
        atomic_write_text(args.out, summary)


if __name__ == "__main__":
    main()
