"""Continued pre-training into a new language at a sweep of mix shares (issue 29 item 2, the
seed's 7-5): how much of the fixed token budget goes to the new language, against how much of the
old one the base forgets.

Each run is `recipes/continued_pretraining_mix.yaml` with the new language's share set (the old
notation gets the rest) and the seed set for the mix's order, the continued pre-training and the
SFT. Per run: the continued base's held-out next-token loss on the test split's corpus lines in
the old notation and in the new language (the same problems, `task: translated`), and after SFT
in the new language only, greedy accuracy on held-out arithmetic asked in the new language and
in the old notation. The shipped base's own losses are the reference (before any new language).
Mean ± sample std over seeds with a 95% t-interval; the plot is the trade-off curve (new-language
loss against old-language loss, one point per share).

    python experiments/language_mix.py --shares 0 0.2 0.5 0.8 1 --seeds 0 1 2 --workers 2 \\
        --out results/continued_pretraining_mix.md --plot results/continued_pretraining_mix.png
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "continued_pretraining_mix.yaml"
OLD = {"arithmetic": {"max_digits": 2, "ood_digits": 3}, "general_points": {"n_cards": 4, "target": 24}}


def variant(base: dict, share: float, seed: int) -> dict:
    """The recipe with the new language at `share` of the tokens and every seed at `seed`."""
    r = copy.deepcopy(base)
    r["name"] = f"language_mix_{share:g}_seed{seed}"
    r["model"]["path"] = str(ROOT / "checkpoints" / "nano-base" / "model")
    pre, sft = r["stages"][0], r["stages"][1]
    pre["corpus"]["mix"]["new"]["share"] = share
    pre["corpus"]["mix"]["old"]["share"] = round(1 - share, 6)
    pre["corpus"]["seed"] = seed
    pre["train"]["seed"] = seed
    sft["train"]["seed"] = seed
    return r


def held_out_losses(model_dir: Path | str, n: int = 200) -> dict[str, float]:
    """Next-token loss over the test split's corpus lines, in the old notation and in the new
    language (the same problems), in nats per character: a translation keeps every character
    count but writes each rewritten one in two bytes (tokens), so per-token losses of the two
    languages are not comparable and per-character ones are."""
    import torch

    from temper.catalog import make_task
    from temper.models.loading import load_model, load_tokenizer

    model, tokenizer = load_model(model_dir).eval(), load_tokenizer(model_dir)
    out = {}
    for lang in ("old", "new"):
        texts = []
        for name, options in OLD.items():
            task = (
                make_task(name, **options)
                if lang == "old"
                else make_task("translated", base=name, options=options, script="cyrillic")
            )
            texts += [task.corpus_text(p) for p in task.sample("test", n, 1234)]
        total, chars = 0.0, 0
        with torch.no_grad():
            for text in texts:
                ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
                k = ids.shape[1] - 1
                total += float(model(input_ids=ids, labels=ids).loss) * k
                chars += len(text) - 1
        out[lang] = total / chars
    return out


def run(base: dict, share: float, seed: int, runs: Path) -> dict:
    folder = runs / f"share-{share:g}" / f"seed-{seed}"
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(variant(base, share, seed), sort_keys=False, allow_unicode=True))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "temper.cli", "run", str(path), "--output-dir", str(folder / "run")]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pre = json.loads((folder / "run" / "01-continued" / "pretrain.json").read_text())
    evals = json.loads((folder / "run" / "03-eval" / "eval.json").read_text())
    acc = {t: evals[t]["sft_new_language"]["test"]["metrics"]["greedy_accuracy"]["value"] for t in evals}
    result = {
        "share": share,
        "seed": seed,
        "loss": held_out_losses(folder / "run" / "01-continued" / "model"),
        "sft_accuracy": {"new": acc["arithmetic_cy"], "old": acc["arithmetic"]},
        "mix": pre["mix"],
        "seconds": pre["seconds"],
    }
    done.write_text(json.dumps(result))
    return result


def t95(xs: list[float]) -> tuple[float, float]:
    crit = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}
    if len(xs) < 2:
        return xs[0], float("nan")
    return statistics.fmean(xs), crit.get(len(xs) - 1, 2.0) * statistics.stdev(xs) / len(xs) ** 0.5


def cell(xs: list[float], scale: float = 1.0, digits: int = 3) -> str:
    m, half = t95([x * scale for x in xs])
    sd = statistics.stdev([x * scale for x in xs]) if len(xs) > 1 else 0.0
    return f"{m:.{digits}f} ± {sd:.{digits}f} [{m - half:.{digits}f}, {m + half:.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.2, 0.5, 0.8, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "language_mix")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    base = yaml.safe_load(RECIPE.read_text())
    # first, in this thread: transformers' lazy imports are not safe to race from the workers
    ref = held_out_losses(ROOT / "checkpoints" / "nano-base" / "model")
    jobs = [(s, seed) for s in args.shares for seed in args.seeds]
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda j: run(base, j[0], j[1], args.runs), jobs))
    rows = {s: [r for r in results if r["share"] == s] for s in args.shares}
    lines = [
        f"# Continued pre-training into a new language: the mix share swept, seeds {', '.join(map(str, args.seeds))}",
        "",
        "Held-out next-token loss of the continued base in nats per character (test-split corpus lines, 200 "
        "problems of each task; per character because the new language spends two tokens on a character), "
        "then greedy accuracy after SFT in the new language only (200 held-out arithmetic problems). "
        "Mean ± std [95% t-interval] over seeds.",
        "",
        f"The shipped nano base before any new language: old-notation loss {ref['old']:.3f}, new-language loss {ref['new']:.3f}.",
        "",
        "| new-language share | realised share | new-language loss | old-notation loss | old loss - base's | "
        "SFT accuracy, asked in the new language % | SFT accuracy, asked in the old notation % |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, rs in rows.items():
        lines.append(
            f"| {s:.0%} | {statistics.fmean(r['mix']['new']['realised_share'] for r in rs):.3f} | "
            f"{cell([r['loss']['new'] for r in rs])} | {cell([r['loss']['old'] for r in rs])} | "
            f"{cell([r['loss']['old'] - ref['old'] for r in rs], digits=3)} | "
            f"{cell([r['sft_accuracy']['new'] for r in rs], 100, 1)} | {cell([r['sft_accuracy']['old'] for r in rs], 100, 1)} |"
        )
    lines += ["", "Per run: " + "; ".join(
        f"{r['share']:g}/seed {r['seed']}: new {r['loss']['new']:.3f}, old {r['loss']['old']:.3f}, "
        f"SFT {100 * r['sft_accuracy']['new']:.1f}%" for r in results
    ) + "."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4.5))
        xs = [statistics.fmean(r["loss"]["old"] for r in rs) for rs in rows.values()]
        ys = [statistics.fmean(r["loss"]["new"] for r in rs) for rs in rows.values()]
        for rs in rows.values():
            ax.scatter(
                [r["loss"]["old"] for r in rs], [r["loss"]["new"] for r in rs], s=10, alpha=0.4, color="grey"
            )
        ax.plot(xs, ys, "o-")
        for i, (s, x, y) in enumerate(zip(rows, xs, ys, strict=True)):
            ax.annotate(f"{s:.0%} new", (x, y), textcoords="offset points", xytext=(6, 8 if i % 2 else -14))
        ax.scatter([ref["old"]], [ref["new"]], marker="x", color="red", label="shipped base")
        ax.set_yscale("log")  # 0% new sits near 30 nats per character, the others near 1.3-1.6
        ax.set_xlabel("old-notation held-out loss, nats per character (forgetting →)")
        ax.set_ylabel("new-language held-out loss, nats per character")
        ax.set_title("continued pre-training: share of the new language")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
