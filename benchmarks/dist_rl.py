"""Seconds per GRPO step in 2 processes (torchrun, gloo, one thread each) vs 1 process (with 2
threads, the same cores; and with 1 thread), at the same global batch, plus the identical-loss check.

The step is grpo_step's shape by default: the `tiny` preset, fp32, P prompts x G samples x T new
tokens at fixed length (no early EOS), one optimizer update over the whole batch. Each process
samples, grades and trains on P / 2 of the groups; DDP averages the gradients. Seconds/step is the
median over the steps after `--warmup` (end-of-step timestamps of the main process); the variants
alternate `--repeats` times and the best median of each is kept. The check compares the 2-process
run's logged rewards, losses and gradient norms with the 1-process run's.

    PYTHONPATH=src:. python benchmarks/dist_rl.py [--steps 6] [--repeats 2] [--prompts 8]
        [--group 8] [--tokens 32] [--preset tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class FirstByteReward:
    """Arithmetic prompts graded by whether the completion starts with an ASCII character below
    'P': a random-init model earns it about a third of the time, so groups have reward variance
    and the gradients the identical-loss check compares are not zero (the arithmetic verifier
    gives a random model 0 everywhere)."""

    def __init__(self, task):
        self.task, self.name = task, "first_byte"

    def sample(self, split, n, seed):
        return self.task.sample(split, n, seed)

    def score(self, problem, completion):
        from temper.tasks.base import Score

        ok = bool(completion) and completion[0] < "P"
        return Score(float(ok), ok, bool(completion), {"reason": "correct" if ok else "wrong"})


def worker(args) -> None:
    """One training run (alone, or one of the torchrun processes); main writes stamps + rows."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from benchmarks.common import NoEos
    from temper import distributed
    from temper.catalog import make_task
    from temper.models import build_preset, build_tokenizer
    from temper.rollout import HFSampler
    from temper.train.rl import RLConfig, train_rl

    try:
        tokenizer = build_tokenizer()
        model = build_preset(args.preset, tokenizer, seed=0)
        model.generation_config.eos_token_id = None
        sampler = HFSampler(model, NoEos(tokenizer, never=model.config.vocab_size))
        config = RLConfig(
            steps=args.steps,
            prompts_per_step=args.prompts,
            group_size=args.group,
            max_new_tokens=args.tokens,
            lr=1e-4,
            minibatches=1,
            seed=0,
            progress=False,
        )
        stamps: list[float] = []
        result = train_rl(
            model,
            tokenizer,
            [FirstByteReward(make_task("arithmetic"))],
            config,
            Path(args.worker),
            sampler=sampler,
            callbacks=[lambda step, row: stamps.append(time.perf_counter())],
        )
        if distributed.is_main():
            Path(args.worker, "bench.json").write_text(json.dumps({"stamps": stamps, "rows": result.history}))
    finally:
        distributed.shutdown()


def launch(args, out: Path, processes: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    cmd = [sys.executable]
    if processes > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    cmd += [__file__, "--worker", str(out)] + [
        f"--{k}={getattr(args, k)}" for k in ("steps", "prompts", "group", "tokens", "preset")
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    data = json.loads((out / "bench.json").read_text())
    stamps = data["stamps"]
    per_step = sorted(b - a for a, b in zip(stamps[args.warmup - 1 :], stamps[args.warmup :]))
    return {"s_per_step": per_step[len(per_step) // 2], "rows": data["rows"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    variants = {
        "1 process, 1 thread": (1, 1),
        "1 process, 2 threads": (1, 2),
        "2 processes x 1 thread": (2, 1),
    }
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, (processes, threads) in variants.items():
                got = launch(args, Path(tmp) / f"{r}-{processes}-{threads}", processes, threads)
                if name not in best or got["s_per_step"] < best[name]["s_per_step"]:
                    best[name] = got
    base = best["1 process, 2 threads"]["s_per_step"]
    print(f"{args.preset}, {args.prompts} prompts x {args.group} samples x {args.tokens} tokens, fp32")
    print(f"{'variant':<24} {'s/step':>8} {'vs 1 process, 2 threads':>24}")
    for name, got in best.items():
        print(f"{name:<24} {got['s_per_step']:8.3f} {base / got['s_per_step']:23.2f}x")
    one, two = best["1 process, 1 thread"]["rows"], best["2 processes x 1 thread"]["rows"]
    same_rewards = all(a["reward"] == b["reward"] for a, b in zip(one, two, strict=True))
    worst = max(
        abs(a[k] - b[k]) / max(abs(a[k]), 1e-12)
        for a, b in zip(one, two)
        for k in ("loss", "grad_norm")
        if abs(a[k]) > 1e-6
    )
    print(
        f"identical-loss check: rewards equal {same_rewards}, max relative gap (loss, grad_norm) {worst:.1e}"
    )


if __name__ == "__main__":
    main()
