"""From samples to training tensors: grade groups, apply reward components, batch, pack for the model.

Kept apart from the RL loop so the loop reads top to bottom: sample -> grade -> tensors ->
advantages -> update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from temper.models.chat import shown_completion
from temper.rewards.components import RewardInput, combine
from temper.rewards.diagnostics import zero_variance_cause
from temper.rollout.sampler import Sample
from temper.tasks.base import Problem, Score, Task, grade_batch


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
    # the group in one call (a data task's reward functions take a batch, as TRL calls them);
    # a verifier exception becomes a "verifier_error" row
    scores = grade_batch(
        task, [problem] * len(samples), [s.text for s in samples], [s.token_ids for s in samples]
    )
    for s, score in zip(samples, scores, strict=True):
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
    """R = groups x group_size sampled sequences, prompt-major. The model reads each sequence whole
    (prompt + completion, see `pack`); every per-token tensor is (R, T) over completion tokens only,
    T = the longest completion: position t holds completion token t, whose logprob comes from the
    logits after prompt + completion[:t]."""

    prompts: list[list[int]]
    completions_R_T: torch.Tensor  # (R, T) token ids, 0 past each completion's end
    mask_R_T: torch.Tensor  # (R, T) bool: t < length of completion r
    # (R, T) the sampler's logprobs (the importance-ratio denominator), 0 past the end
    old_logprobs_R_T: torch.Tensor
    rewards_G_N: torch.Tensor  # (G, N)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(
            self.prompts,
            self.completions_R_T.to(device),
            self.mask_R_T.to(device),
            self.old_logprobs_R_T.to(device),
            self.rewards_G_N.to(device),
        )


def to_batch(groups: list[Group]) -> RolloutBatch:
    rows = [r for g in groups for r in g.rollouts]
    width = max(len(r.sample.token_ids) for r in rows)
    completions = torch.zeros((len(rows), width), dtype=torch.long)
    old = torch.zeros((len(rows), width))
    for i, r in enumerate(rows):
        n = len(r.sample.token_ids)
        completions[i, :n] = torch.tensor(r.sample.token_ids, dtype=torch.long)
        old[i, :n] = torch.tensor(r.sample.logprobs, dtype=torch.float32)
    lengths = torch.tensor([len(r.sample.token_ids) for r in rows])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
    return RolloutBatch([list(r.sample.prompt_ids) for r in rows], completions, mask, old, rewards)


@dataclass
class Packed:
    """Sequences packed into rows without padding between them, as SFT packing does: each sequence's
    position ids restart at 0 and the model gets no attention mask, so transformers detects the packed
    sequences from `position_ids` and keeps each from attending to the others. Only the tail of a row
    is padding (its positions continue the last sequence's numbering; nothing reads them)."""

    input_ids_P_W: torch.Tensor  # (P, W)
    position_ids_P_W: torch.Tensor  # (P, W)
    index_N: torch.Tensor  # (N,) flat index into P x W of the position that predicts each completion token
    targets_N: torch.Tensor  # (N,) the completion tokens, in the row-major order of mask_B_T


def pack(prompts: list[list[int]], completions_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> Packed:
    """Pack B sequences (prompt + completion, minus the last token, which predicts nothing) into rows
    of width W = the longest of them, first-fit by decreasing length. A row never holds more tokens
    than the padded batch's row would, so attention costs no more than the padded batch; the rows
    hold no padding between sequences and the vocabulary projection is applied at `index_N` only.
    `mask_B_T` marks a prefix of each row: completion tokens 0 .. length - 1."""
    lengths = mask_B_T.sum(-1).tolist()
    completions = completions_B_T.tolist()
    seqs = [p + c[: max(n - 1, 0)] for p, c, n in zip(prompts, completions, lengths)]
    width = max(len(s) for s in seqs)
    rows: list[list[int]] = []  # sequence indices per row
    used: list[int] = []
    for b in sorted(range(len(seqs)), key=lambda b: -len(seqs[b])):
        row = next((i for i, u in enumerate(used) if u + len(seqs[b]) <= width), None)
        if row is None:
            rows.append([])
            used.append(0)
            row = len(rows) - 1
        rows[row].append(b)
        used[row] += len(seqs[b])
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    first = [0] * len(seqs)  # flat index of the position predicting completion token 0 of sequence b
    for i, members in enumerate(rows):
        offset = 0
        for b in members:
            n = len(seqs[b])
            ids[i, offset : offset + n] = torch.tensor(seqs[b], dtype=torch.long)
            positions[i, offset : offset + n] = torch.arange(n)
            first[b] = i * width + offset + len(prompts[b]) - 1
            offset += n
        last = positions[i, offset - 1] + 1 if offset else 0
        positions[i, offset:] = torch.arange(last, last + width - offset)
    index = torch.cat([torch.arange(first[b], first[b] + n) for b, n in enumerate(lengths)])
    device = completions_B_T.device
    return Packed(ids.to(device), positions.to(device), index.to(device), completions_B_T[mask_B_T.bool()])


def rollout_record(step: int, group: Group, tokenizer: Any = None) -> list[dict[str, Any]]:
    """JSON rows for rollouts.jsonl (what the report shows as sample rollouts). With the tokenizer,
    `completion` keeps the special tokens generation ran past, marked, as eval examples do
    (`temper.models.chat.shown_completion`), and `graded` is the text graded when it differs."""
    return [
        {
            "step": step,
            "problem": r.problem.id,
            "prompt": r.problem.prompt,
            **_completion(r.sample, tokenizer),
            "reward": r.reward,
            "parts": r.parts,
            "correct": r.score.correct,
            "parsed": r.score.parsed,
            "reason": r.score.details.get("reason"),
            "stop": r.sample.stop_reason,
        }
        for r in group.rollouts
    ]


def _completion(sample: Sample, tokenizer: Any) -> dict[str, str]:
    if tokenizer is None:
        return {"completion": sample.text}
    shown = shown_completion(tokenizer, sample.token_ids, sample.stop_reason)
    return {"completion": shown} | ({"graded": sample.text} if sample.text != shown else {})
