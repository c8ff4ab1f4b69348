"""The model-size trend of an SFT-vs-RL comparison (issue 13 item 4): the same recipe run on
several shipped bases (a multiseed grid over `model.path`), each model's ID and OOD accuracy
against the base's parameter count, and how the gap between the branches moves with size.

    python experiments/multiseed.py recipes/sft_vs_rl_general_points_rules.yaml --seeds 0 1 2 \\
        --vary sft_branch,grpo_branch,ppo_branch --workers 2 --threads 1 \\
        --grid model.path=../checkpoints/nano-base/model,../checkpoints/tiny-base/model,../checkpoints/small-base/model
    python experiments/size_trend.py runs/sft_vs_rl_general_points_rules --task gp \\
        --out results/size_trend.md --plot results/size_trend.png

Per base: each model's greedy accuracy on the ID test split and the OOD split, mean ± sample
std [min, max] over seeds, and on the last split (OOD) how often it followed the prompt's rule
(`rule_followed`: of the answers with every number card right, those that value the face cards
as the prompt says); the per-seed difference of each RL branch from the SFT branch with
its 95% t-interval; and a paired comparison on the same problems, pooled over seeds (every model
of a seed is evaluated on the same problems): the problems only the SFT branch solves against
those only the RL branch solves, with McNemar's exact two-sided p-value (binomial, p = 1/2).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import yaml
from tables import paired, spread, t_interval, table

from temper.atomic import atomic_write_text


def bases(root: Path, recipes: Path) -> list[tuple[str, int, dict[int, Path]]]:
    """(base name, parameters, {seed: run folder}) per cell under `root`, smallest base first."""
    cells = (
        [root] if any(root.glob("seed-*")) else [c for c in sorted(root.iterdir()) if any(c.glob("seed-*"))]
    )
    out = []
    for cell in cells:
        runs = {int(p.name.split("-")[1]): p for p in sorted(cell.glob("seed-*")) if _eval_json(p)}
        if not runs:
            continue
        path = yaml.safe_load((next(iter(runs.values())) / "recipe.yaml").read_text())["model"]["path"]
        model = (recipes / path).resolve()
        summary = model.parent / "pretrain.json"
        params = json.loads(summary.read_text())["parameters"] if summary.exists() else _count(model)
        out.append((model.parent.name, params, runs))
    return sorted(out, key=lambda b: b[1])


def _count(model: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())


def _eval_json(run: Path) -> Path | None:
    found = sorted(run.glob("[0-9][0-9]-eval/eval.json"))
    return found[0] if found else None


def results(runs: dict[int, Path], task: str) -> dict[int, dict]:
    """{seed: {model: {split: result}}}; the starting model (named by its path, which differs per
    base) is called `base`, so it is one series across bases."""
    out = {}
    for seed, run in runs.items():
        models = json.loads(_eval_json(run).read_text())[task]
        out[seed] = {("base" if "/" in name else name): r for name, r in models.items()}
    return out


def rule_followed(reasons: dict[str, int]) -> float | None:
    """Of the greedy answers that use every number card right, the share whose face cards also
    take the prompt's values: (correct + wrong_value) / (those + wrong_face_value). GeneralPoints
    reasons (`wrong_value` is only given once the literals are the card values); None when no
    answer got the number cards right."""
    right = reasons.get("correct", 0) + reasons.get("wrong_value", 0)
    total = right + reasons.get("wrong_face_value", 0)
    return right / total if total else None


def mcnemar(a: list[str], b: list[str]) -> tuple[int, int, float]:
    """(problems only `a` solves, only `b` solves, exact two-sided p) over paired 0/1 strings."""
    only_a = sum(
        x == "1" and y == "0" for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True)
    )
    only_b = sum(
        x == "0" and y == "1" for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True)
    )
    n, k = only_a + only_b, min(only_a, only_b)
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
    return only_a, only_b, p


def summarize(found, task: str, sft: str, rl: list[str], splits: list[str]) -> str:
    lines = []
    for name, params, runs in found:
        res = results(runs, task)
        models = list(next(iter(res.values())))
        lines += [f"## {name} ({params / 1e6:.2f}M parameters), seeds {sorted(runs)}", ""]
        rows = []
        for model in models:
            cells = []
            for split in splits:
                values = [r[model][split]["metrics"]["greedy_accuracy"]["value"] for r in res.values()]
                cells.append(spread(values, 100, 1))
            followed = [rule_followed(r[model][splits[-1]]["reasons"]) for r in res.values()]
            cells.append("–" if None in followed else spread(followed, 100, 1))
            rows.append([model, *cells])
        header = ["model", *(f"{s} greedy %" for s in splits), f"{splits[-1]} rule followed %"]
        lines += table(header, rows) + [""]
        rows = []
        for model in rl:
            if model not in models or sft not in models:
                continue
            for split in splits:
                a = [r[sft][split]["metrics"]["greedy_accuracy"]["value"] for r in res.values()]
                b = [r[model][split]["metrics"]["greedy_accuracy"]["value"] for r in res.values()]
                per_problem = "–"
                if all("greedy_correct" in r[m][split] for r in res.values() for m in (sft, model)):
                    only_a, only_b, p = mcnemar(
                        [r[sft][split]["greedy_correct"] for r in res.values()],
                        [r[model][split]["greedy_correct"] for r in res.values()],
                    )
                    per_problem = f"{only_a} vs {only_b}, p = {p:.3g}"
                rows.append([f"{model} - {sft}", split, paired(a, b, 100, 1), per_problem])
        if rows:
            header = ["difference", "split", "points (per seed) [95% CI]", f"only {sft} vs only RL solves"]
            lines += table(header, rows) + [""]
    return "\n".join(lines)


def gaps(found, task: str, sft: str, model: str, split: str) -> list[tuple[int, float, float]]:
    """(parameters, mean, 95% half-width) of `model` - `sft` greedy accuracy on `split`, in
    points, paired per seed, for each base that has both models."""
    out = []
    for _, params, runs in found:
        res = [r for r in results(runs, task).values() if model in r and sft in r]
        if res:
            d = [
                100
                * (
                    r[model][split]["metrics"]["greedy_accuracy"]["value"]
                    - r[sft][split]["metrics"]["greedy_accuracy"]["value"]
                )
                for r in res
            ]
            out.append((params, *t_interval(d)))
    return out


def plot(found, task: str, splits: list[str], path: Path, sft: str | None = None, rl: list[str] = ()) -> None:
    """Greedy accuracy against parameters (log scale), one panel per split, one line per model:
    mean ± sample std over seeds, each seed a dot. With `sft` and `rl`, a last panel: the gap
    RL - SFT on the last split (OOD), paired per seed, with its 95% t-interval."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(splits) + bool(sft and rl)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    models = list(dict.fromkeys(m for _, _, runs in found for r in results(runs, task).values() for m in r))
    for ax, split in zip(axes[0][: len(splits)], splits, strict=True):
        for i, model in enumerate(models):
            xs, ms, ss = [], [], []
            for _, params, runs in found:
                res = results(runs, task)
                values = [
                    100 * r[model][split]["metrics"]["greedy_accuracy"]["value"]
                    for r in res.values()
                    if model in r
                ]
                if not values:
                    continue
                xs.append(params)
                ms.append(statistics.mean(values))
                ss.append(statistics.stdev(values) if len(values) > 1 else 0.0)
                ax.plot([params] * len(values), values, ".", color=f"C{i}", alpha=0.5)
            ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, color=f"C{i}", label=model)
        ax.set_xscale("log")
        ax.set_xlabel("base parameters")
        ax.set_ylabel("greedy accuracy %")
        ax.set_title(f"{task} {split}")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    if sft and rl:
        ax = axes[0][-1]
        for i, model in enumerate(rl):
            points = gaps(found, task, sft, model, splits[-1])
            xs = [p * (1.04 if i else 1 / 1.04) for p, _, _ in points]  # side by side, not on top
            ax.errorbar(
                xs,
                [m for _, m, _ in points],
                yerr=[h for _, _, h in points],
                marker="o",
                capsize=3,
                color=f"C{models.index(model) if model in models else i}",
                label=f"{model} - {sft}",
            )
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("base parameters")
        ax.set_ylabel("points (95% t-interval over seeds)")
        ax.set_title(f"{task} {splits[-1]}: RL - SFT gap")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the multiseed run folder (cells holding seed-<s>/)")
    parser.add_argument("--task", default="gp")
    parser.add_argument("--splits", default="test,ood")
    parser.add_argument("--sft", default="sft_branch", help="the SFT branch's model name")
    parser.add_argument("--rl", default="grpo_branch,ppo_branch", help="the RL branches' model names")
    parser.add_argument("--recipes", type=Path, default=Path("recipes"), help="the recipe's folder")
    parser.add_argument("--out")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    found = bases(args.root, args.recipes)
    if not found:
        raise SystemExit(f"{args.root}: no finished seed with an eval stage")
    splits = args.splits.split(",")
    text = summarize(found, args.task, args.sft, args.rl.split(","), splits)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    if args.plot:
        plot(found, args.task, splits, args.plot, args.sft, args.rl.split(","))


if __name__ == "__main__":
    main()
