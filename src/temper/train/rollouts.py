"""From samples to training tensors: grade groups, apply reward components, pad into a batch.

Kept apart from the RL loop so the loop reads top to bottom: sample -> grade -> tensors ->
advantages -> update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from temper.rewards.components import RewardInput, combine
from temper.rewards.diagnostics import zero_variance_cause
from temper.rollout.sampler import Sample
from temper.tasks.base import Problem, Score, Task, grade


@dataclass
class Rollout:
    """One graded sample of a group."""

    problem: Problem
    sample: Sample
    score: Score
    reward: float
    parts: dict[str, float]  # unweighted reward components


@dataclass
class Group:
    rollouts: list[Rollout]
    cause: str | None = None  # why all rewards are equal (None: they differ)
    rewards: list[float] = field(default_factory=list)


def grade_group(
    task: Task,
    problem: Problem,
    samples: list[Sample],
    weights: dict[str, float],
    max_new_tokens: int,
    overlong_buffer: int,
) -> Group:
    rollouts = []
    for s in samples:
        score = grade(task, problem, s.text)  # a verifier exception becomes a "verifier_error" row
        x = RewardInput(score, len(s.token_ids), max_new_tokens, s.stop_reason == "length", overlong_buffer)
        total, parts = combine(x, weights)
        rollouts.append(Rollout(problem, s, score, total, parts))
    rewards = [r.reward for r in rollouts]
    cause = zero_variance_cause(
        [r.score for r in rollouts], rewards, [r.sample.stop_reason == "length" for r in rollouts]
    )
    return Group(rollouts, cause, rewards)


@dataclass
class RolloutBatch:
    """Right-padded (R, L) tensors for R = groups x group_size sequences prompt + completion.

    Position t of `targets` holds token t+1 and `mask` marks the positions whose target is a
    completion token: the logits at those positions are the policy's choices."""

    input_ids: torch.Tensor  # (R, L)
    targets: torch.Tensor  # (R, L)
    mask: torch.Tensor  # (R, L) bool
    old_logprobs: torch.Tensor  # (R, L), sampler logprobs at the masked positions, 0 elsewhere
    rewards_G_N: torch.Tensor  # (G, N)
    lengths: torch.Tensor  # (R,) completion tokens


def to_batch(groups: list[Group], pad_id: int) -> RolloutBatch:
    rows = [r for g in groups for r in g.rollouts]
    width = max(len(r.sample.prompt_ids) + len(r.sample.token_ids) for r in rows)
    R = len(rows)
    input_ids = torch.full((R, width), pad_id, dtype=torch.long)
    targets = torch.full((R, width), pad_id, dtype=torch.long)
    mask = torch.zeros((R, width), dtype=torch.bool)
    old = torch.zeros((R, width))
    for i, r in enumerate(rows):
        p, c = r.sample.prompt_ids, r.sample.token_ids
        seq = torch.tensor(p + c)
        input_ids[i, : len(seq)] = seq
        targets[i, : len(seq) - 1] = seq[1:]
        mask[i, len(p) - 1 : len(p) - 1 + len(c)] = True
        old[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(r.sample.logprobs)
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
    lengths = torch.tensor([len(r.sample.token_ids) for r in rows])
    return RolloutBatch(input_ids, targets, mask, old, rewards, lengths)


def rollout_record(step: int, group: Group) -> list[dict[str, Any]]:
    """JSON rows for rollouts.jsonl (what the report shows as sample rollouts)."""
    return [
        {
            "step": step,
            "problem": r.problem.id,
            "prompt": r.problem.prompt,
            "completion": r.sample.text,
            "reward": r.reward,
            "parts": r.parts,
            "correct": r.score.correct,
            "parsed": r.score.parsed,
            "reason": r.score.details.get("reason"),
            "stop": r.sample.stop_reason,
        }
        for r in group.rollouts
    ]
