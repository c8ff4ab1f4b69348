"""The RL trainer: sample a batch of prompts x group -> grade -> advantages -> policy epochs -> sync.

One loop serves the GRPO family (group-relative outcome advantages: grpo, dr_grpo, rloo,
reinforce_pp) and PPO (a value head and GAE over token rewards). Departures from the textbook
loop, each a small function below:
1. DAPO dynamic sampling (Yu et al. 2025 §3.2): groups whose rewards are all equal are dropped
   and more prompts are drawn until the batch is full or `max_sampling_rounds` is reached.
2. The importance ratio is taken against the sampler's logprobs (no second forward pass to
   recompute "old" logprobs; tests check the sampler matches teacher forcing).
3. KL to the frozen reference either as a loss term (k3, GRPO) or in the reward (k1, RLHF).
4. Every step logs the zero-variance share by cause, not just the reward.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from temper.data.chat import prompt_ids
from temper.rewards.diagnostics import breakdown
from temper.rollout import HFSampler, Sampler
from temper.tasks.base import Problem, Task
from temper.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from temper.train.metrics import MetricsLog, progress_bar
from temper.train.rl_config import RLConfig
from temper.train.rl_update import ValueHead, prepare, update
from temper.train.rollouts import Group, grade_group, rollout_record, to_batch
from temper.train.schedule import lr_at

__all__ = ["RLConfig", "RLResult", "collect_groups", "problems_for_step", "rollout_metrics", "train_rl"]


@dataclass
class RLResult:
    steps: int
    history: list[dict[str, Any]]
    seconds: float
    sampled_tokens: int
    trained_tokens: int


def problems_for_step(
    tasks: list[Task], n: int, seed: int, step: int, round_: int = 0
) -> list[tuple[Task, Problem]]:
    """n training problems, a pure function of (seed, step, round): resume replays them exactly."""
    out = []
    for i, task in enumerate(tasks):
        k = n // len(tasks) + (i < n % len(tasks))
        out += [(task, p) for p in task.sample("train", k, seed=(seed * 1_000_003 + step) * 17 + round_)]
    return out


def collect_groups(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    step: int,
) -> tuple[list[Group], dict[str, float]]:
    """Sample and grade `prompts_per_step` groups; with dynamic sampling, replace constant-reward
    groups by fresh ones until the batch is full (or the round cap is hit). Like DAPO, a refill
    round over-samples by the share of groups the previous round kept (at most 4x)."""
    kept: list[Group] = []
    causes: list[str | None] = []
    rounds, keep_rate = 0, 1.0
    while len(kept) < config.prompts_per_step and rounds < (
        config.max_sampling_rounds if config.dynamic_sampling else 1
    ):
        need = config.prompts_per_step - len(kept)
        before = len(kept)
        draw = need if rounds == 0 else min(4 * need, math.ceil(need / max(keep_rate, 0.25)))
        drawn = problems_for_step(tasks, draw, config.seed, step, rounds)
        prompts = [prompt_ids(tokenizer, p.messages()) for _, p in drawn]
        samples = sampler.sample(
            prompts,
            config.group_size,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            seed=config.seed * 1_000_003 + step * 97 + rounds,
        )
        for (task, problem), group_samples in zip(drawn, samples):
            group = grade_group(
                task, problem, group_samples, config.rewards, config.max_new_tokens, config.overlong_buffer
            )
            if rounds == 0:
                causes.append(group.cause)  # the breakdown describes the policy, before filtering
            if not config.dynamic_sampling or group.cause is None:
                kept.append(group)
        keep_rate = (len(kept) - before) / max(len(drawn), 1)
        rounds += 1
    kept = kept[: config.prompts_per_step]
    stats = breakdown(causes) | {"sampling_rounds": rounds}
    if config.dynamic_sampling:
        stats["kept_groups"] = len(kept)
    return kept, stats


def train_rl(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    out_dir: str | Path,
    *,
    sampler: Sampler | None = None,
    reference: torch.nn.Module | None = None,
    evaluate: Callable[[int], dict[str, float]] | None = None,
    callbacks: list[Callable[[int, dict[str, Any]], None]] = (),
) -> RLResult:
    """Train `model` in place. `reference` is the frozen model for the KL term (required when
    kl_coef > 0). Resumes from the newest checkpoint under `out_dir/checkpoints`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.kl_coef > 0 and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    if config.aggregation not in ("token", "sample", "constant"):
        raise ValueError(f"unknown aggregation {config.aggregation!r}; valid: token, sample, constant")
    if config.kl_mode not in ("loss", "reward"):
        raise ValueError(f"unknown kl_mode {config.kl_mode!r}; valid: loss, reward")
    device = next(model.parameters()).device
    sampler = sampler or HFSampler(model, tokenizer)
    value_head = ValueHead(model.config.hidden_size).to(device) if config.advantage == "gae" else None
    params = [p for p in model.parameters() if p.requires_grad]
    if value_head is not None:
        params += list(value_head.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.99))
    trainable = torch.nn.ModuleDict(
        {"policy": model} | ({"value": value_head} if value_head is not None else {})
    )

    log = MetricsLog(out_dir / "metrics.jsonl")
    rollouts_path = out_dir / "rollouts.jsonl"
    start = 0
    if checkpoints := list_checkpoints(out_dir / "checkpoints"):
        start = load_checkpoint(checkpoints[-1], trainable, optimizer)
        log.truncate_after(start)
        MetricsLog(rollouts_path).truncate_after(start)  # replayed steps are logged again
    else:
        for path in (log.path, rollouts_path):
            path.unlink(missing_ok=True)

    history: list[dict[str, Any]] = []
    sampled_tokens = trained_tokens = 0
    t_start = time.perf_counter()
    progress = progress_bar(config.progress)
    with progress:
        bar = progress.add_task(out_dir.name or "rl", total=config.steps, completed=start, info="")
        for step in range(start, config.steps):
            # 1. sample and grade
            t0 = time.perf_counter()
            model.eval()
            groups, zero_var = collect_groups(sampler, tokenizer, tasks, config, step)
            t1 = time.perf_counter()
            row = {"step": step + 1} | zero_var | rollout_metrics(groups, config, t1 - t0)
            sampled_tokens += round(row["response_length"] * sum(len(g.rollouts) for g in groups))
            with rollouts_path.open("a") as f:
                for g in groups[: config.log_rollouts]:
                    f.writelines(json.dumps(rec) + "\n" for rec in rollout_record(step + 1, g))
            # 2. tensors, reference logprobs and values (no grad), advantages
            prepared = prepare(
                to_batch(groups, tokenizer.pad_token_id), model, reference, value_head, config, device
            )
            t2 = time.perf_counter()
            # 3. policy (and value) updates
            lr = lr_at(
                step,
                lr=config.lr,
                max_steps=config.steps,
                warmup_steps=config.warmup_steps,
                schedule=config.schedule,
            )
            stats, tokens = update(model, value_head, optimizer, params, prepared, config, step, lr)
            trained_tokens += tokens
            sampler.sync(model)
            t3 = time.perf_counter()
            row |= {k: sum(v) / len(v) for k, v in stats.items()}
            if prepared.ref_kl is not None:
                row["kl_ref"] = float(
                    (prepared.ref_kl * prepared.mask).sum() / prepared.mask.sum().clamp_min(1)
                )
            row |= {
                "lr": lr,
                "time/prepare": t2 - t1,
                "time/train": t3 - t2,
                "train_tokens_per_s": tokens / max(t3 - t2, 1e-9),
            }
            if (
                evaluate is not None
                and config.eval_every
                and ((step + 1) % config.eval_every == 0 or step + 1 == config.steps)
            ):
                model.eval()
                row |= {f"eval/{k}": v for k, v in evaluate(step + 1).items()}
            log.log(row)
            history.append(row)
            progress.update(bar, advance=1, info=f"reward {row['reward']:.3f} acc {row['accuracy']:.3f}")
            for cb in callbacks:
                cb(step + 1, row)
            if config.save_every and (step + 1) % config.save_every == 0:
                save_checkpoint(out_dir / "checkpoints", step + 1, trainable, optimizer)
    model.eval()
    return RLResult(config.steps, history, time.perf_counter() - t_start, sampled_tokens, trained_tokens)


def rollout_metrics(groups: list[Group], config: RLConfig, seconds: float) -> dict[str, float]:
    """Means over the step's samples: reward (total and per component), accuracy, format, length."""
    rollouts = [r for g in groups for r in g.rollouts]
    n = len(rollouts)
    new_tokens = sum(len(r.sample.token_ids) for r in rollouts)
    row = {
        "reward": sum(r.reward for r in rollouts) / n,
        "accuracy": sum(r.score.correct for r in rollouts) / n,
        "parse_rate": sum(r.score.parsed for r in rollouts) / n,
        "truncation_rate": sum(r.sample.stop_reason == "length" for r in rollouts) / n,
        "response_length": new_tokens / n,
        "rollout_tokens_per_s": new_tokens / max(seconds, 1e-9),
        "time/sample": seconds,
    }
    return row | {f"reward/{name}": sum(r.parts[name] for r in rollouts) / n for name in config.rewards}
