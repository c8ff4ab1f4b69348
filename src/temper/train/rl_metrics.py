"""The RL loop's metrics: means over a step's samples, per-episode facts of agent runs, and the
update's statistics averaged over processes (the features add their own, `temper.train.features`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temper.rewards import BATCH_COMPONENTS
from temper.rollout.trajectory import mean_signals
from temper.train.rollouts import Group

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from accelerate import Accelerator

    from temper.train.rl_config import RLConfig


def rollout_metrics(groups: list[Group], config: RLConfig, seconds: float) -> dict[str, float]:
    """Means over the step's samples: reward (total and per component), accuracy, format, length;
    for multi-turn episodes also turns, environment time and the share of each stop reason."""
    rollouts = [r for g in groups for r in g.rollouts]
    n = len(rollouts)
    new_tokens = sum(r.tokens for r in rollouts)
    row = {
        "reward": sum(r.reward for r in rollouts) / n,
        "accuracy": sum(r.score.correct for r in rollouts) / n,
        "parse_rate": sum(r.score.parsed for r in rollouts) / n,
        "truncation_rate": sum(r.trajectory.truncated for r in rollouts) / n,
        "response_length": new_tokens / n,
        "rollout_tokens_per_s": new_tokens / max(seconds, 1e-9),
        "time/sample": seconds,
    }
    row |= {f"reward/{name}": sum(r.parts[name] for r in rollouts) / n for name in config.rewards}
    if any(name in BATCH_COMPONENTS for name in config.rewards):
        # a learned (proxy) reward: the verifier's reward of every sample, whatever its weight (0:
        # never trained on), is the gold the proxy is judged by (Gao et al. 2023)
        row["reward/gold"] = sum(r.score.reward for r in rollouts) / n
    functions: dict[str, list[float]] = {}  # a data task's reward functions, each on its own (as TRL
    for r in rollouts:  # logs rewards/<name>/mean), over the samples each one graded (None: not applicable)
        for name, value in (r.score.details.get("rewards") or {}).items():
            if value is not None:
                functions.setdefault(name, []).append(value)
    row |= {f"reward_fn/{name}": sum(v) / len(v) for name, v in functions.items()}
    if any(len(r.trajectory.segments) > 2 for r in rollouts):  # an agent run: per-episode facts
        row |= episode_metrics([r.trajectory for r in rollouts])
    return row


def episode_metrics(trajectories: list) -> dict[str, float]:
    """Turns per episode, environment seconds per episode, the share of each stop reason, and the
    mean per episode of every numeric step signal (tool calls, tool errors, invalid moves...).
    With gateway episodes (or any episode of several rows: a rewritten history) also the
    training rows per episode (`gateway/segments_per_episode`) and the step's count of calls
    that started a new row (`gateway/rewrites`)."""
    n = len(trajectories)
    row = {
        "episode/turns": sum(t.turns for t in trajectories) / n,
        "episode/env_seconds": sum(t.seconds_in_env for t in trajectories) / n,
        "episode/tokens": sum(len(t.completion_ids) for t in trajectories) / n,
    }
    rows = [len(t.rows) for t in trajectories]
    if max(rows) > 1 or any("gateway_calls" in s for t in trajectories for s in t.signals):
        row["gateway/segments_per_episode"] = sum(rows) / n
        row["gateway/rewrites"] = sum(rows) - n
    for reason in sorted({t.stop_reason for t in trajectories}):
        row[f"episode/stop_{reason}"] = sum(t.stop_reason == reason for t in trajectories) / n
    return row | {f"signal/{k}": v for k, v in mean_signals(trajectories).items()}


def update_metrics(
    stats: dict[str, list[float]], prepared: Any, accelerator: Accelerator
) -> dict[str, float]:
    """The update's statistics (means of its lists) averaged over processes, and the KL to the
    reference per token (`kl_ref`) and per sequence (`kl_ref_seq`: the KL of Gao et al.'s
    over-optimization axis, sqrt KL), summed over every process's completion tokens. The
    sampler/trainer `mismatch/...` diagnostics (`prepare`) are each process's, averaged like the
    update's statistics (under N processes `max_abs` is the mean of the processes' maxima)."""
    row = _mean_over_processes(
        {k: sum(v) / len(v) for k, v in stats.items()} | _ref_kl_sums(prepared) | prepared.mismatch,
        accelerator,
    )
    if "kl_ref/sum" in row:
        total = row.pop("kl_ref/sum")
        row["kl_ref"] = total / max(row.pop("kl_ref/tokens"), 1)
        row["kl_ref_seq"] = total / max(row.pop("kl_ref/rows"), 1)
    return row


def _ref_kl_sums(prepared: Any) -> dict[str, float]:
    """k1 to the reference summed over this process's completion tokens, their count and the
    count of sequences."""
    if prepared.ref_kl is None:
        return {}
    return {
        "kl_ref/sum": float((prepared.ref_kl * prepared.mask).sum()),
        "kl_ref/tokens": float(prepared.mask.sum()),
        "kl_ref/rows": float(prepared.mask.shape[0]),
    }


def _mean_over_processes(values: dict[str, float], accelerator: Accelerator) -> dict[str, float]:
    """Per-process values averaged over processes (sums: `/sum` and `/tokens` keys, added up)."""
    import torch

    if accelerator.num_processes == 1:
        return values
    keys = sorted(values)
    t = accelerator.reduce(torch.tensor([values[k] for k in keys], dtype=torch.float64), "sum")
    world = accelerator.num_processes
    return {k: float(v) if k.startswith("kl_ref/") else float(v) / world for k, v in zip(keys, t.tolist())}
