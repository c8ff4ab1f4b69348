"""Thinking in a language the SFT data never used (issue 29 item 3, the seed's 7-7), over seeds.

Two arms of `recipes/thinking_language.yaml`, the same SFT (traces in Cyrillic and Greek only):
the base continued on all three languages (`with georgian`) or on Cyrillic and Greek only
(`without georgian`). Per run, greedy completions of 200 held-out problems per split: test asks
for cyrillic or greek (the SFT languages), ood for georgian. Reported: accuracy (the answer line,
graded by arithmetic's verifier), the share of traces written in the language asked for
(`language.identify` over every script and the plain notation), and in which language the ood
traces were written instead. Mean ± std [95% t-interval] over seeds; paired arm differences.

    python experiments/thinking_language.py --seeds 0 1 2 --workers 2 --out results/thinking_language.md
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "thinking_language.yaml"
ARMS = {"with georgian": ["cyrillic", "greek", "georgian"], "without georgian": ["cyrillic", "greek"]}


def variant(base: dict, languages: list[str], seed: int) -> dict:
    r = copy.deepcopy(base)
    r["name"] = f"thinking_language_{len(languages)}_seed{seed}"
    r["model"]["path"] = str(ROOT / "checkpoints" / "nano-base" / "model")
    r["tasks"]["think"]["languages"] = languages
    pre, sft = r["stages"][0], r["stages"][1]
    pre["corpus"]["seed"] = pre["train"]["seed"] = sft["train"]["seed"] = seed
    return r


def greedy_traces(model_dir: Path, task_options: dict, n: int = 200) -> dict[str, dict]:
    """Per split: accuracy, the share of traces in the asked language and the languages found."""
    from temper.catalog import make_task
    from temper.data.chat import prompt_ids
    from temper.models.loading import load_model, load_tokenizer
    from temper.rollout.hf_sampler import HFSampler

    options = {k: v for k, v in task_options.items() if k != "task"}
    task = make_task("thinking_language", **options)
    model, tokenizer = load_model(model_dir).eval(), load_tokenizer(model_dir)
    sampler = HFSampler(model, tokenizer)
    out = {}
    for split in ("test", "ood"):
        problems = task.sample(split, n, 1234)
        prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
        samples = sampler.sample(prompts, 1, max_new_tokens=48, temperature=0.0)
        scores = [task.score(p, s[0].text) for p, s in zip(problems, samples, strict=True)]
        out[split] = {
            "accuracy": sum(s.correct for s in scores) / n,
            "in_asked": sum(s.details["trace_in_asked"] for s in scores) / n,
            "languages": dict(Counter(s.details["trace_language"] for s in scores)),
            "example": samples[0][0].text,
        }
    return out


def run(base: dict, arm: str, seed: int, runs: Path) -> dict:
    folder = runs / arm.replace(" ", "_") / f"seed-{seed}"
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    recipe = variant(base, ARMS[arm], seed)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "temper.cli", "run", str(path), "--output-dir", str(folder / "run")]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = {
        "arm": arm,
        "seed": seed,
        **greedy_traces(folder / "run" / "02-sft" / "model", recipe["tasks"]["think"]),
    }
    done.write_text(json.dumps(result, ensure_ascii=False))
    return result


def t95(xs: list[float]) -> str:
    crit = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:+.1f}"
    half = crit.get(len(xs) - 1, 2.0) * statistics.stdev(xs) / len(xs) ** 0.5
    return f"{m:+.1f} ({', '.join(f'{x:+.1f}' for x in xs)}) [{m - half:+.1f}, {m + half:+.1f}]"


def cell(xs: list[float]) -> str:
    m, sd = statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{100 * m:.1f} ± {100 * sd:.1f} [{100 * min(xs):.1f}, {100 * max(xs):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "thinking_language")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from temper.models.loading import load_model  # noqa: F401  (transformers' lazy imports: not from the workers)

    base = yaml.safe_load(RECIPE.read_text())
    jobs = [(arm, seed) for arm in ARMS for seed in args.seeds]
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda j: run(base, j[0], j[1], args.runs), jobs))
    by = {arm: sorted((r for r in results if r["arm"] == arm), key=lambda r: r["seed"]) for arm in ARMS}
    lines = [
        f"# Thinking in a language the SFT data never used: seeds {', '.join(map(str, args.seeds))}",
        "",
        "Greedy, 200 held-out problems per split; test asks for cyrillic or greek (the SFT traces' languages), "
        "ood for georgian (in no SFT example). Mean ± std [min, max] over seeds.",
        "",
        "| pre-trained on | split | accuracy % | trace in the asked language % | trace languages (summed over seeds) |",
        "|---|---|---|---|---|",
    ]
    for arm, rs in by.items():
        for split in ("test", "ood"):
            found = sum((Counter(r[split]["languages"]) for r in rs), Counter())
            lines.append(
                f"| {arm} | {split} | {cell([r[split]['accuracy'] for r in rs])} | "
                f"{cell([r[split]['in_asked'] for r in rs])} | {', '.join(f'{k} {v}' for k, v in found.most_common())} |"
            )
    a, b = by["with georgian"], by["without georgian"]
    lines += [
        "",
        "Paired, with minus without georgian (per seed, 95% t-interval): ood trace in georgian "
        f"{t95([100 * (x['ood']['in_asked'] - y['ood']['in_asked']) for x, y in zip(a, b, strict=True)])} pp; "
        f"ood accuracy {t95([100 * (x['ood']['accuracy'] - y['ood']['accuracy']) for x, y in zip(a, b, strict=True)])} pp.",
        "",
        "One ood completion per run: "
        + "; ".join(f"{r['arm']}/seed {r['seed']}: {r['ood']['example']!r}" for r in results)
        + ".",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
