"""Seconds per supervised step and peak memory per process under `strategy: ddp` vs `fsdp`, both
in 2 processes (torchrun, gloo, one thread each) at the same global batch, plus the check that the
two give the same losses and gradient norms.

The step is `train_supervised` over random token rows of `--len` tokens, `--batch` sequences per
step (half per process), AdamW, on the `tiny` or `small` preset in fp32. fsdp shards a copy of the
model per decoder layer and gathers its full weights back into the plain model after every step
(`temper.train.strategy`), so its step pays that gather; its memory is one full copy plus half of
parameters, gradients and AdamW's moments. Seconds/step is the median over the steps after
`--warmup` (end-of-step timestamps of the main process); peak memory is the main process's max
RSS. The variants alternate `--repeats` times and the best median of each is kept.

    PYTHONPATH=src:. python benchmarks/fsdp_step.py [--preset tiny|small] [--steps 8] [--batch 16]
        [--len 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("ddp", "fsdp")


def worker(args) -> None:
    """One torchrun process of one variant; the main one writes its stamps, rows and peak RSS."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from temper import distributed
    from temper.data.dataset import Sequence
    from temper.models import build_preset, build_tokenizer
    from temper.train import NextToken, TrainConfig, train_supervised

    try:
        tokenizer = build_tokenizer()
        model = build_preset(args.preset, tokenizer, seed=0)
        g = torch.Generator().manual_seed(0)
        rows = torch.randint(3, model.config.vocab_size, (4 * args.batch, args.len), generator=g).tolist()
        data = [Sequence(ids, list(ids), list(range(len(ids)))) for ids in rows]
        config = TrainConfig(
            max_steps=args.steps, batch_size=args.batch, lr=1e-4, warmup_steps=0, log_every=1,
            strategy=args.strategy, progress=False,
        )  # fmt: skip
        stamps: list[float] = []
        result = train_supervised(
            model,
            data,
            config,
            Path(args.worker),
            objective=NextToken(tokenizer.pad_token_id),
            callbacks=[lambda step, row: stamps.append(time.perf_counter())],
        )
        if distributed.is_main():
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out = {"stamps": stamps, "rows": result.history, "peak_mb": peak_mb}
            Path(args.worker, "bench.json").write_text(json.dumps(out))
    finally:
        distributed.shutdown()


def launch(args, out: Path, strategy: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [__file__, "--worker", str(out), f"--strategy={strategy}"] + [
        f"--{k}={getattr(args, k)}" for k in ("steps", "batch", "len", "preset")
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    data = json.loads((out / "bench.json").read_text())
    stamps = data["stamps"]
    per_step = sorted(b - a for a, b in zip(stamps[args.warmup - 1 :], stamps[args.warmup :]))
    return {"s_per_step": per_step[len(per_step) // 2], "rows": data["rows"], "peak_mb": data["peak_mb"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--strategy", choices=STRATEGIES, help=argparse.SUPPRESS)
    p.add_argument("--preset", default="tiny", choices=("nano", "tiny", "small"))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--len", type=int, default=128)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.steps <= args.warmup:
        p.error("--steps must be above --warmup (the median is over the steps after it)")

    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for strategy in STRATEGIES:
                got = launch(args, Path(tmp) / f"{r}-{strategy}", strategy)
                if strategy not in best or got["s_per_step"] < best[strategy]["s_per_step"]:
                    best[strategy] = got
    print(f"{args.preset}, 2 processes x 1 thread, {args.batch} sequences x {args.len} tokens per step, fp32")
    print(f"{'strategy':<10} {'s/step':>8} {'vs ddp':>8} {'peak RSS (MB)':>14}")
    base = best["ddp"]["s_per_step"]
    for strategy, got in best.items():
        print(
            f"{strategy:<10} {got['s_per_step']:8.3f} {base / got['s_per_step']:7.2f}x {got['peak_mb']:14.0f}"
        )
    worst = max(
        abs(a[k] - b[k]) / max(abs(a[k]), 1e-12)
        for a, b in zip(best["ddp"]["rows"], best["fsdp"]["rows"], strict=True)
        for k in ("loss", "grad_norm")
    )
    print(f"same-loss check: max relative gap ddp vs fsdp (loss, grad_norm) {worst:.1e}")


if __name__ == "__main__":
    main()
