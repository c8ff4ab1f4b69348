"""Seconds per RL step, lockstep vs bounded-staleness rollouts (`async_rollouts.max_staleness` k),
side by side in one run, on a task whose environment takes time.

The task is arithmetic played as a one-step environment whose round of steps sleeps `--env-ms`
before grading (one `step_batch` call for the round's episodes, so a step's batch costs that
once): an environment that is neither the model nor the CPU, like a sandbox
call, a tool or a judge. `--env-ms auto` sets it to the lockstep run's measured generation time
per step, the issue's "environment time about equal to generation time". Everything else is
benchmarks/grpo_step.py's step (P prompts x G samples x T new tokens, fp32, one update per step).

Seconds/step is the median over the steps after `--warmup` (end-of-step timestamps). For k > 0
the worker is a forked process with one torch thread and the trainer keeps the
rest; for k = 0 the one process has every thread. Also printed per run: the sampling time (the
worker's own for k > 0), the training time, how long the trainer waited for each batch, and the
mean reward (the runs differ in which weights sampled each batch, so rewards differ).

    PYTHONPATH=src:. python benchmarks/async_rl.py [--preset tiny] [--steps 10] [--warmup 2]
        [--prompts 8] [--group 8] [--tokens 32] [--env-ms auto] [--ks 0,1,2] [--json out.json]
        [--keep runs/async_bench]   # then: temper simulate runs/async_bench/k0 --k 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.common import machine_line, median  # noqa: E402
from benchmarks.grpo_step import load, per_step_seconds  # noqa: E402
from temper.catalog import make_task  # noqa: E402
from temper.envs.base import TaskEnv  # noqa: E402
from temper.train.features.async_rollouts import AsyncRollouts  # noqa: E402
from temper.train.rl import RLConfig, train_rl  # noqa: E402
from temper.train.user_code import UserCodeConfig  # noqa: E402


class SlowEnv(TaskEnv):
    """A one-step env whose round of steps takes `seconds` (a sleep: no CPU) before the task
    grades the round's answers: the agent loop steps a whole round of these in one `step_batch`
    call (`batch_across_groups`), so the batch's env time per step is `seconds`, once."""

    batch_across_groups = True

    def __init__(self, task, problem, seconds: float):
        super().__init__(task, problem)
        self.seconds = seconds

    @staticmethod
    def step_batch(envs, actions, ids):
        time.sleep(envs[0].seconds)
        return TaskEnv.step_batch(envs, actions, ids)


class SlowTask:
    """`task` with every answer graded through a `SlowEnv`."""

    def __init__(self, task, seconds: float):
        self.task, self.seconds = task, seconds
        self.name = task.name

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def make_env(self, problem):
        return SlowEnv(self.task, problem, self.seconds)


def run(args, k: int, env_s: float, keep: bool = True) -> dict[str, Any]:
    model, tokenizer = load(args.preset)
    task = SlowTask(make_task("arithmetic"), env_s) if env_s > 0 else make_task("arithmetic")
    config = RLConfig(
        steps=args.steps, prompts_per_step=args.prompts, group_size=args.group, max_new_tokens=args.tokens,
        temperature=1.0, lr=1e-5, seed=0, progress=False,
        async_rollouts=AsyncRollouts(max_staleness=k),
        # a random-init model's groups all score 0: train on them anyway, as TRL does (the
        # default stops a run after 5 such steps)
        user_code=UserCodeConfig(zero_variance_steps=0),
    )  # fmt: skip
    stamps: list[float] = []
    rows: list[dict[str, Any]] = []

    def on_step(step: int, row: dict[str, Any]) -> None:
        stamps.append(time.perf_counter())
        rows.append(row)

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) / f"k{k}" if args.keep and keep else Path(tmp)
        train_rl(model, tokenizer, [task], config, out, callbacks=[on_step])
    measured = rows[args.warmup :]
    return {
        "k": k,
        "env_ms": 1000 * env_s,
        "s_per_step": median(per_step_seconds(stamps, args.warmup)),
        "sample": median([r["time/sample"] for r in measured]),
        "train": median([r["time/prepare"] + r["time/train"] for r in measured]),
        "waited": median([r.get("async/wait", r["time/sample"]) for r in measured]),
        "reward": sum(r["reward"] for r in rows) / len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--env-ms", default="auto", help="env step time in ms, or auto (= generation time)")
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--keep", default="", help="keep each run's folder under DIR/k<k> (for temper simulate)"
    )
    args = parser.parse_args()
    print(machine_line())
    ks = [int(k) for k in args.ks.split(",")]
    if args.env_ms == "auto":
        probe = run(args, 0, 0.0, keep=False)  # its folder is not the k = 0 run's
        env_s = probe["sample"]
        print(
            f"generation per step (lockstep, no env time): {probe['sample']:.3f} s -> env step {env_s:.3f} s"
        )
    else:
        env_s = float(args.env_ms) / 1000
    shape = f"{args.prompts} x {args.group} x {args.tokens}"
    print(
        f"{args.preset} at {shape}, env step {1000 * env_s:.0f} ms, {args.steps} steps (median after {args.warmup})"
    )
    results = [run(args, k, env_s) for k in ks]
    base = next((r for r in results if r["k"] == 0), results[0])
    print("| k | s/step | vs k=0 | sampling+env s | train s | trainer waited s | mean reward |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['k']} | {r['s_per_step']:.3f} | {base['s_per_step'] / r['s_per_step']:.2f}x | "
            f"{r['sample']:.3f} | {r['train']:.3f} | {r['waited']:.3f} | {r['reward']:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_line(), "shape": shape, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
