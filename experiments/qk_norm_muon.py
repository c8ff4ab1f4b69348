"""QK norm and Muon against the baseline in pre-training (issue 29 item 1, the seed's experiment
7-3): four arms — baseline (Llama, AdamW), +QK norm (`model.qk_norm`: Qwen3's per-head q/k
RMSNorm), +Muon (`train.optimizer: muon`), both — pre-trained from scratch on the presets' corpus
(arithmetic and GeneralPoints lines) with the same data, steps, schedule and peak lr, over seeds
(the seed sets the initialization and the data order).

Per run: the training loss every `log_every` steps, the steps at which the smoothed loss (a
trailing mean of 5 logged points) first reaches each threshold, the held-out loss (next-token
loss on the test split's corpus lines, which pre-training never sees), the base's skill in its
notation (experiments/base_skill.py: greedy completion of held-out arithmetic and GeneralPoints
prefixes) and seconds per step. The table gives mean ± sample std over seeds and each arm's
paired difference from the baseline (same seed) with a 95% t-interval; the plot the loss curves.

    python experiments/qk_norm_muon.py --preset nano --steps 600 --seeds 0 1 2 \\
        --out results/qk_norm_muon.md --plot results/qk_norm_muon.png

Seconds per step are the runs' own (median of the logged windows); on a shared machine they say
little, the steps to a loss say what each change buys.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "baseline": {"qk_norm": False, "optimizer": "adamw"},
    "qk_norm": {"qk_norm": True, "optimizer": "adamw"},
    "muon": {"qk_norm": False, "optimizer": "muon"},
    "qk_norm+muon": {"qk_norm": True, "optimizer": "muon"},
}
THRESHOLDS = (0.6, 0.45)
"""Near the baseline's final loss at 400 nano steps (~0.38): the first sweep's 2.0 / 1.5 / 1.25 were
crossed by every arm within 60-90 steps and could not show a speed-up."""


def recipe(preset: str, arm: dict, seed: int, steps: int, lr: float) -> dict:
    return {
        "name": "qk_norm_muon",
        "model": {"preset": preset, "seed": seed, "qk_norm": arm["qk_norm"]},
        "tasks": {
            "arithmetic": {"max_digits": 2, "ood_digits": 3},
            "general_points": {"n_cards": 4, "target": 24},
        },
        "stages": [
            {
                "kind": "pretrain",
                "corpus": {"tasks": ["arithmetic", "general_points"], "problems_per_task": 20000, "seed": 0},
                "max_len": 256,
                "train": {
                    "max_steps": steps,
                    "batch_size": 16,
                    "lr": lr,
                    "warmup_steps": max(1, steps // 20),
                    "schedule": "cosine",
                    "log_every": 10,
                    "seed": seed,
                    "optimizer": arm["optimizer"],
                    "progress": False,
                },  # fmt: skip
            }
        ],
    }


def held_out_loss(model, tokenizer, n: int = 200) -> float:
    """Mean next-token loss over the test split's corpus lines (one line per row, no packing)."""
    import torch

    from temper.tasks import Arithmetic, ArithmeticConfig, GeneralPoints, GeneralPointsConfig

    texts = []
    for task in (
        Arithmetic(ArithmeticConfig(max_digits=2, ood_digits=3)),
        GeneralPoints(GeneralPointsConfig(n_cards=4, target=24)),
    ):
        texts += [task.corpus_text(p) for p in task.sample("test", n, 1234)]
    total, tokens = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            out = model(input_ids=ids, labels=ids)
            k = ids.shape[1] - 1
            total, tokens = total + float(out.loss) * k, tokens + k
    return total / tokens


def skill(model, tokenizer, n: int = 100) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "experiments"))
    from base_skill import complete, graded, prefixes

    from temper.tasks import Arithmetic, ArithmeticConfig, GeneralPoints, GeneralPointsConfig

    out = {}
    for task, max_new in (
        (Arithmetic(ArithmeticConfig(max_digits=2, ood_digits=3)), 12),
        (GeneralPoints(GeneralPointsConfig(n_cards=4, target=24)), 96),
    ):
        items = prefixes(task, "test", n, 0)
        texts = complete(model, tokenizer, [p for _, p in items], max_new)
        out[task.name] = sum(graded(task, pr, p, c) for (pr, p), c in zip(items, texts, strict=True)) / n
    return out


def smoothed(losses: list[float], window: int = 5) -> list[float]:
    return [statistics.fmean(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))]


def steps_to(steps: list[int], losses: list[float], threshold: float) -> int | None:
    return next((s for s, v in zip(steps, smoothed(losses), strict=True) if v <= threshold), None)


def run(preset: str, name: str, arm: dict, seed: int, steps: int, lr: float, runs: Path) -> dict:
    folder = runs / name / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(preset, arm, seed, steps, lr), sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "temper.cli", "run", str(path), "--output-dir", str(folder / "run")]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    rows = [
        json.loads(x) for x in (folder / "run" / "01-pretrain" / "metrics.jsonl").read_text().splitlines()
    ]
    rows = [r for r in rows if "loss" in r]
    from temper.models.loading import load_model, load_tokenizer

    model_dir = folder / "run" / "01-pretrain" / "model"
    model, tokenizer = load_model(model_dir).eval(), load_tokenizer(model_dir)
    result = {
        "arm": name,
        "seed": seed,
        "steps": [r["step"] for r in rows],
        "loss": [r["loss"] for r in rows],
        "held_out": held_out_loss(model, tokenizer),
        "skill": skill(model, tokenizer),
        # packed rows of 256 tokens, 16 a step: seconds per step from the logged token rate
        "s_per_step": statistics.median(
            [16 * 256 / r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
        ),
    }
    done.write_text(json.dumps(result))
    return result


def speed_up(run: dict, target: float) -> float | None:
    """How many times fewer steps than the baseline's whole run this run needs to reach the
    baseline's final (smoothed) loss `target`; None if it never does."""
    at = steps_to(run["steps"], run["loss"], target)
    return None if at is None else run["steps"][-1] / at


def t95(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval (n - 1 degrees of freedom)."""
    crit = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = crit.get(len(xs) - 1, 2.0) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def fmt(xs: list[float], digits: int = 3) -> str:
    if any(x is None for x in xs):
        return f"{sum(x is None for x in xs)}/{len(xs)} never"
    if len(xs) < 2:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.fmean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--runs", default="runs/qk_norm_muon")
    parser.add_argument("--out", default="")
    parser.add_argument("--plot", default="")
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    args = parser.parse_args()
    thresholds = args.thresholds
    runs = Path(args.runs)
    results = {
        a: [run(args.preset, a, ARMS[a], s, args.steps, args.lr, runs) for s in args.seeds] for a in args.arms
    }
    lines = [
        f"# QK norm and Muon in pre-training ({args.preset}, {args.steps} steps, batch 16 x 256 tokens, "
        f"lr {args.lr} cosine, seeds {' '.join(map(str, args.seeds))})",
        "",
        "| arm | final train loss (smoothed) | held-out loss | "
        + " | ".join(f"steps to loss {t}" for t in thresholds)
        + " | speed-up to the baseline's final loss | arithmetic (base skill) | GeneralPoints (base skill) | s/step |",
        "|---|---|---|" + "---|" * len(thresholds) + "---|---|---|---|",
    ]
    final = {r["seed"]: smoothed(r["loss"])[-1] for r in results.get("baseline", [])}
    for a, rs in results.items():
        cells = [
            fmt([smoothed(r["loss"])[-1] for r in rs]),
            fmt([r["held_out"] for r in rs]),
            *(fmt([steps_to(r["steps"], r["loss"], t) for r in rs], 0) for t in thresholds),
            fmt([speed_up(r, final[r["seed"]]) for r in rs], 2) if final else "-",
            fmt([100 * r["skill"]["arithmetic"] for r in rs], 1),
            fmt([100 * r["skill"]["general_points"] for r in rs], 1),
            fmt([r["s_per_step"] for r in rs], 3),
        ]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    if "baseline" in results:
        lines += ["", "Paired differences from the baseline (same seed), mean [95% t-interval]:", ""]
        lines += ["| arm | held-out loss | final train loss | arithmetic (pp) |", "|---|---|---|---|"]
        base = {r["seed"]: r for r in results["baseline"]}
        for a, rs in results.items():
            if a == "baseline":
                continue
            d_held = [r["held_out"] - base[r["seed"]]["held_out"] for r in rs]
            d_loss = [smoothed(r["loss"])[-1] - smoothed(base[r["seed"]]["loss"])[-1] for r in rs]
            d_arith = [100 * (r["skill"]["arithmetic"] - base[r["seed"]]["skill"]["arithmetic"]) for r in rs]
            cells = ["{:+.3f} [{:+.3f}, {:+.3f}]".format(*t95(d)) for d in (d_held, d_loss)]
            cells.append("{:+.1f} [{:+.1f}, {:+.1f}]".format(*t95(d_arith)))
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
        for i, (a, rs) in enumerate(results.items()):
            for j, r in enumerate(rs):
                ax.plot(
                    r["steps"], smoothed(r["loss"]), color=f"C{i}", alpha=0.8, label=a if j == 0 else None
                )
        ax.set(xlabel="step", ylabel="training loss (trailing mean of 5 logs)", yscale="log")
        ax.set_title(f"QK norm and Muon, {args.preset} preset, one line per seed")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
