"""DPO step: temper's preference trainer vs TRL's DPOTrainer on the same model, pairs and batch.

Both train the same freshly initialized preset with sigmoid DPO (beta 0.1) on the same string
pairs (prompt / chosen / rejected, EOS appended to each completion as TRL does; the token ids are
checked equal on both sides), fp32 on CPU, AdamW, one optimizer step per batch of `--batch`
pairs. Tokens/s counts the real (unpadded) tokens of the 2 x batch sequences each step scores, as
the median over the steps after a warm-up. The runs alternate (temper, TRL, TRL, temper, ...)
`--repeats` times, so drifting machine load hits both sides; the table gives the median run of
each side with the spread (min-max) over the repeats, the ratio of the medians, the median and
spread of the ratios of the runs made next to each other, and the 1-minute load average seen
before each run (on a shared machine that is what the figures mean anything against).

TRL runs twice: with its defaults (a frozen copy of the model scores the reference logprobs at
every step) and with `precompute_ref_log_probs=True` (one pass before training, as temper always
does); the ratio is taken against the faster of the two (`--trl-modes precompute` runs only the first). Two pair shapes: `fixed` (every prompt
and completion the same length, so padding plays no part) and `variable` (lengths drawn at
random, as real pairs are; padding to the longest row of the batch is part of the cost).

    python benchmarks/dpo_step.py [--preset tiny] [--steps 30] [--batch 16] [--shapes fixed,variable]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import machine_line, matmul_params, matmul_peak_gflops, median
from temper.data.preferences import Pair, tokenize_pairs
from temper.models import build_preset, build_tokenizer
from temper.train import TrainConfig
from temper.train.preference import DPO, Preference
from temper.train.supervised import train_supervised

SHAPES = {
    # (prompt chars, completion chars incl. EOS): (lo, hi) drawn uniformly per row
    "fixed": ((64, 64), (64, 64)),
    "variable": ((16, 96), (4, 64)),
}


def pairs(n: int, shape: str, seed: int = 0) -> list[dict[str, str]]:
    """`n` string pairs of arithmetic-looking text whose lengths follow `shape` (the byte-level
    tokenizer gives one token per character; the completion's last token is the EOS TRL adds)."""
    rng = random.Random(seed)
    (p_lo, p_hi), (c_lo, c_hi) = SHAPES[shape]

    def text(length: int) -> str:
        out = ""
        while len(out) < length:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out += f"{a}+{b}={a + b} "
        return out[:length]

    return [
        {
            "prompt": text(rng.randint(p_lo, p_hi)),
            "chosen": text(rng.randint(c_lo, c_hi) - 1),
            "rejected": text(rng.randint(c_lo, c_hi) - 1),
        }
        for _ in range(n)
    ]


def temper_run(preset: str, rows: list[dict[str, str]], steps: int, batch: int, warmup: int) -> dict:
    tokenizer = build_tokenizer()
    model = build_preset(preset, tokenizer, seed=0)
    items, stats = tokenize_pairs(
        tokenizer,
        [Pair("bench", i, r["prompt"], r["chosen"], r["rejected"]) for i, r in enumerate(rows)],
        10**6,
    )
    assert len(items) == len(rows) and not stats.truncated
    config = TrainConfig(
        max_steps=steps,
        batch_size=batch,
        lr=1e-5,
        warmup_steps=1,
        log_every=1,  # one metrics row per step: its tokens_per_s is that step's alone
        grad_clip=1.0,
        progress=False,
        precision="fp32",
    )
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        train_supervised(
            model, items, config, out, objective=Preference(DPO(beta=0.1), tokenizer.pad_token_id)
        )
        total = time.perf_counter() - start
        per_step = [
            json.loads(line)["tokens_per_s"] for line in Path(out, "metrics.jsonl").read_text().splitlines()
        ]
    return {
        "tok_s": median(per_step[warmup:]),
        "seconds": total,
        "ids": [(p.chosen.input_ids, p.rejected.input_ids) for p in items],
    }


def trl_run(
    preset: str, rows: list[dict[str, str]], steps: int, batch: int, warmup: int, precompute: bool
) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    tokenizer = build_tokenizer()
    model = build_preset(preset, tokenizer, seed=0)
    stamps: list[float] = []
    tokens: list[int] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=steps,
            learning_rate=1e-5,
            max_grad_norm=1.0,
            warmup_steps=1,
            logging_steps=10**9,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            max_length=None,
            bf16=False,
            disable_tqdm=True,
            seed=0,
            beta=0.1,
            loss_type=["sigmoid"],
            precompute_ref_log_probs=precompute,
        )
        start = time.perf_counter()
        trainer = DPOTrainer(
            model=model,
            # without precompute TRL scores the reference with a frozen copy at every step (it would
            # load one from the model's hub name; a preset has none, so it is given)
            ref_model=None if precompute else copy.deepcopy(model),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[Stamp()],
        )
        collate = trainer.data_collator

        def counting(examples):  # the real tokens of each batch, in the order the steps take them
            out_ = collate(examples)
            tokens.append(int(out_["attention_mask"].sum()))
            return out_

        trainer.data_collator = counting
        ds = trainer.train_dataset
        ids = [
            (p + c, p + r)
            for p, c, r in zip(ds["prompt_ids"], ds["chosen_ids"], ds["rejected_ids"], strict=True)
        ]
        trainer.train()
        total = time.perf_counter() - start
    # stamps[i] ends step i; batch i's tokens are tokens[i] (a prefetching loader collates ahead,
    # in order)
    per_step = [tokens[i] / (stamps[i] - stamps[i - 1]) for i in range(max(warmup, 1), len(stamps))]
    return {"tok_s": median(per_step), "seconds": total, "ids": ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--shapes", default="fixed,variable")
    parser.add_argument("--repeats", type=int, default=2, help="alternating temper/TRL runs per shape")
    parser.add_argument("--trl-modes", default="precompute,default", help="TRL runs: precompute, default")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    torch.manual_seed(0)
    peak = matmul_peak_gflops()
    print(f"{machine_line()}\nmatmul peak (2048^2): fp32 {peak:.1f} GFLOP/s\n")
    n = matmul_params(build_preset(args.preset, build_tokenizer()))
    modes = args.trl_modes.split(",")
    results = []
    for shape in args.shapes.split(","):
        rows = pairs(args.steps * args.batch, shape)
        runs: dict[str, list[dict]] = {"temper": [], **{f"trl_{m}": [] for m in modes}}
        loads: list[float] = []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits every side
            loads.append(os.getloadavg()[0])
            runs["temper"].append(temper_run(args.preset, rows, args.steps, args.batch, args.warmup))
            for m in modes:
                loads.append(os.getloadavg()[0])
                runs[f"trl_{m}"].append(
                    trl_run(args.preset, rows, args.steps, args.batch, args.warmup, m == "precompute")
                )
            print(
                f"{shape}: "
                + ", ".join(f"{name} {r[-1]['tok_s']:,.0f}" for name, r in runs.items())
                + f" tok/s (load {loads[-1]:.1f})",
                flush=True,
            )
        ids_temper = runs["temper"][0]["ids"]
        for m in modes:
            if runs[f"trl_{m}"][0]["ids"] != [tuple(x) for x in ids_temper]:
                raise SystemExit(f"{shape}: temper and TRL tokenized the pairs differently")
        tok_s = {name: [r["tok_s"] for r in rs] for name, rs in runs.items()}
        med = {name: median(v) for name, v in tok_s.items()}
        peer = max((f"trl_{m}" for m in modes), key=lambda name: med[name])
        paired = [ours / theirs for ours, theirs in zip(tok_s["temper"], tok_s[peer])]
        lengths = [len(c) + len(r) for c, r in ids_temper]
        results.append(
            {
                "shape": shape,
                "preset": args.preset,
                "params": n,
                "batch": args.batch,
                "mean_tokens_per_pair": sum(lengths) / len(lengths),
                **{f"{k}_tok_s": v for k, v in med.items()},
                "peer": peer,
                "ratio": med["temper"] / med[peer],
                "paired_ratios": paired,
                "temper_mfu": 6 * n * med["temper"] / (peak * 1e9),
                "runs": tok_s,
                "load_avg_1min": loads,
            }
        )

    def spread(xs: list[float]) -> str:
        return f"{median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"

    print(
        "\n| shape | tokens / pair | temper tok/s | "
        + " | ".join(f"TRL {m} tok/s" for m in modes)
        + " | temper / best TRL (medians) | paired ratios: median (min-max) | load avg | temper MFU |"
    )
    print("|---" * (7 + len(modes)) + "|")
    for r in results:
        ratios = r["paired_ratios"]
        print(
            f"| {r['shape']} | {r['mean_tokens_per_pair']:.0f} | {spread(r['runs']['temper'])} | "
            + " | ".join(spread(r["runs"][f"trl_{m}"]) for m in modes)
            + f" | **{r['ratio']:.2f}x** | {median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {min(r['load_avg_1min']):.1f}-{max(r['load_avg_1min']):.1f} | {100 * r['temper_mfu']:.0f}% |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_line(), "peak_gflops": peak, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
