"""SFT throughput: temper's trainer vs TRL's SFTTrainer on the same model, batch and length.

Both train the same freshly initialized preset on the same pre-tokenized rows (no packing, every
row exactly `seq` tokens, so padding plays no part), fp32 on CPU, AdamW, one optimizer step per
batch. Tokens/s is measured over the steps after a warm-up; MFU = 6 x matmul parameters x
tokens/s / the fp32 matmul peak measured in the same run. An extra column runs temper with
`precision: auto` (bf16 autocast where this machine measures it faster, else fp32; the verdict is
measured afresh in this run, not read from the cache); the header names the CPU and its AMX /
AVX512-BF16 flags and gives the bf16 matmul peak beside the fp32 one, since bf16 figures differ
by machine far more than fp32 ones.

    python benchmarks/sft_throughput.py [--presets nano,tiny] [--steps 30] [--batch 16] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import torch

from benchmarks.common import machine_line, matmul_params, matmul_peak_gflops, median
from temper.data.dataset import Sequence
from temper.models import build_preset, build_tokenizer
from temper.train import NextToken, TrainConfig, train_supervised


def rows(tokenizer, n: int, seq: int, seed: int = 0) -> list[list[int]]:
    """Arithmetic text packed into rows of exactly `seq` tokens."""
    rng = random.Random(seed)
    stream: list[int] = []
    while len(stream) < n * seq:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        stream += tokenizer(f"{a}+{b}={a + b}", add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
    return [stream[i * seq : (i + 1) * seq] for i in range(n)]


def temper_tokens_per_s(
    preset: str, data: list[list[int]], steps: int, batch: int, warmup: int, precision: str = "fp32"
) -> tuple[float, dict]:
    """(tokens/s, the precision it ran in)."""
    tokenizer = build_tokenizer()
    model = build_preset(preset, tokenizer, seed=0)
    seqs = [Sequence(r, list(r), list(range(len(r)))) for r in data]
    stamps: list[float] = []
    config = TrainConfig(
        max_steps=steps,
        batch_size=batch,
        lr=1e-3,
        warmup_steps=1,
        log_every=10**9,
        grad_clip=1.0,
        progress=False,
        precision=precision,
    )
    with tempfile.TemporaryDirectory() as out:
        result = train_supervised(
            model,
            seqs,
            config,
            out,
            objective=NextToken(tokenizer.pad_token_id),
            callbacks=[lambda step, row: stamps.append(time.perf_counter())],
        )
    per_step = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]
    return batch * len(data[0]) / median(per_step), result.precision


def trl_tokens_per_s(preset: str, data: list[list[int]], steps: int, batch: int, warmup: int) -> float:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    tokenizer = build_tokenizer()
    model = build_preset(preset, tokenizer, seed=0)
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=steps,
            learning_rate=1e-3,
            max_grad_norm=1.0,
            lr_scheduler_type="cosine",
            warmup_steps=1,
            logging_steps=10**9,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            packing=False,
            max_length=len(data[0]),
            bf16=False,
            disable_tqdm=True,
            seed=0,
        )
        dataset = Dataset.from_dict({"input_ids": data})
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[Stamp()]
        )
        trainer.train()
    per_step = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]
    return batch * len(data[0]) / median(per_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="nano,tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="alternating temper/TRL runs per preset")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    torch.manual_seed(0)
    # `auto` decides in this run, on this machine as it is now, not from an older cached verdict
    os.environ["TEMPER_CACHE_DIR"] = tempfile.mkdtemp(prefix="temper-bench-")
    peak = matmul_peak_gflops()
    peak_bf16 = matmul_peak_gflops(dtype=torch.bfloat16, repeats=3)
    print(
        f"{machine_line()}\n"
        f"matmul peak (2048^2): fp32 {peak:.1f} GFLOP/s, bf16 {peak_bf16:.1f} GFLOP/s "
        f"({peak_bf16 / peak:.2f}x)\n"
    )
    results = []
    for preset in args.presets.split(","):
        data = rows(build_tokenizer(), args.steps * args.batch, args.seq)
        ours, theirs, auto = [], [], []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits all three
            ours.append(temper_tokens_per_s(preset, data, args.steps, args.batch, args.warmup)[0])
            theirs.append(trl_tokens_per_s(preset, data, args.steps, args.batch, args.warmup))
            tok_s, choice = temper_tokens_per_s(preset, data, args.steps, args.batch, args.warmup, "auto")
            auto.append(tok_s)
        n = matmul_params(build_preset(preset, build_tokenizer()))
        ours_best, theirs_best = max(ours), max(theirs)
        row = {
            "preset": preset,
            "params": n,
            "batch": args.batch,
            "seq": args.seq,
            "temper_tok_s": ours_best,
            "trl_tok_s": theirs_best,
            "ratio": ours_best / theirs_best,
            "temper_mfu": 6 * n * ours_best / (peak * 1e9),
            "trl_mfu": 6 * n * theirs_best / (peak * 1e9),
            "auto_tok_s": max(auto),
            "auto_dtype": choice["dtype"],
            "auto_figures": choice["figures"],
            "temper_runs": ours,
            "trl_runs": theirs,
            "auto_runs": auto,
        }
        results.append(row)
    print(
        "| preset | matmul params | batch x seq | temper tok/s | TRL tok/s | ratio | temper MFU | TRL MFU "
        "| temper auto tok/s (chose) | auto / fp32 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['preset']} | {r['params'] / 1e6:.2f}M | {r['batch']} x {r['seq']} | {r['temper_tok_s']:,.0f} | "
            f"{r['trl_tok_s']:,.0f} | {r['ratio']:.2f}x | {100 * r['temper_mfu']:.0f}% | {100 * r['trl_mfu']:.0f}% "
            f"| {r['auto_tok_s']:,.0f} ({r['auto_dtype']}) | {r['auto_tok_s'] / r['temper_tok_s']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": machine_line(),
                    "peak_gflops": peak,
                    "peak_bf16_gflops": peak_bf16,
                    "results": results,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
