"""A process reward model: one score per step of a completion, and a solution score from them.

The model is the policy's architecture with a one-output token head (`AutoModelForTokenClassification`,
num_labels=1), so it saves and loads the Hugging Face way. A step's score is sigma(z) at the step's
last token: the probability that the step is correct (and, with the labels of `temper.tasks.steps`,
that the solution is still on track after it). Steps come from `temper.tasks.steps.segment`; their
tokens are found in the sampled ids themselves (`step_token_ends`), never by re-tokenizing text.

A solution's score aggregates its step scores (`aggregate`): `min` (the weakest step) or `product`
(the probability that every step is right, if their errors were independent; Lightman et al. 2023
section 2.6 score a solution by the product).

As an RL reward (the `process_reward_model` batch component, `prm_scorer`), a PRM is used in one of
two ways (`Mode`):

- dense: step k's score sigma(z_k) is a reward on the token that ends step k (`TokenRewards`), as
  in Math-Shepherd's step-by-step PPO, where the PRM scores each step at its end (Wang et al. 2024,
  "Math-Shepherd", arXiv:2312.08935). Its return is sum_k sigma(z_k); only a
  per-token estimator (GAE) credits each step on its own, so the recipe allows dense with
  `advantage: gae` only (an outcome estimator would see the plain sum, which pays for more steps).
- min / product: one outcome score per completion, the step scores aggregated as for ranking
  (Lightman et al. 2023 section 2.6; Wang et al. 2024 take the min), used like any outcome reward
  by every estimator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from temper.lazy import no_grad
from temper.tasks.steps import IGNORE, Span, segment

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from transformers import PreTrainedTokenizerBase

Aggregate = Literal["min", "product"]
Mode = Literal["dense", "min", "product"]
"""How the RL reward component uses the step scores: per token (dense) or aggregated (min, product)."""

PRM = "process_reward_model"
"""The reward component's name in `rewards:` (and of the recipe key naming the model)."""
PROCESS_REWARD_MODEL_DIR = "process_reward_model"
"""The folder a `process_reward_model` stage writes inside its output folder."""


def step_token_ends(
    tokenizer: PreTrainedTokenizerBase, completion_ids: Sequence[int], spans: Sequence[Span]
) -> list[int]:
    """For each span of the completion's text, the index (into `completion_ids`) of the token that
    holds the span's last character; the outcome span's is always the last token (the end-of-turn
    token when the completion has one). Two steps can end at the same token (a completion cut off
    inside its first line: its last equation and the outcome); `token_labels` resolves that.
    The text is the ids decoded as the sampler decodes them (`skip_special_tokens`)."""
    if not completion_ids:
        return []
    last = len(completion_ids) - 1
    # decoded length after each token: token i holds characters [ends[i-1], ends[i])
    ends = [len(tokenizer.decode(completion_ids[: i + 1], skip_special_tokens=True)) for i in range(last + 1)]
    return [
        last if span.outcome else next((i for i, e in enumerate(ends) if e >= span.end), last)
        for span in spans
    ]


def token_labels(ends: Sequence[int], labels: Sequence[int], length: int) -> list[int]:
    """A label per completion token: each step's label at its last token, IGNORE elsewhere. Where
    several steps end at one token, the token gets the lowest of their labels that is not IGNORE
    (bad if any of them is): the first error is never hidden behind a later step's label."""
    out = [IGNORE] * length
    for end, label in zip(ends, labels, strict=True):
        if label != IGNORE:
            out[end] = label if out[end] == IGNORE else min(out[end], label)
    return out


def aggregate(step_scores: Sequence[float], how: Aggregate = "min") -> float:
    """A solution's score from its step scores in (0, 1): the min, or the product. No steps: 0."""
    if not step_scores:
        return 0.0
    if how == "min":
        return min(step_scores)
    if how == "product":
        return math.prod(step_scores)
    raise ValueError(f"aggregate must be 'min' or 'product', got {how!r}")


class ProcessRewardModel:
    """A saved PRM folder (model + tokenizer) that scores steps, batched, without gradients."""

    def __init__(self, model, tokenizer: PreTrainedTokenizerBase):
        self.model = model.eval()
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None) -> ProcessRewardModel:
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path}: no process reward model here (no config.json); a process_reward_model stage "
                "saves one to <stage out>/process_reward_model"
            )
        model = AutoModelForTokenClassification.from_pretrained(path).requires_grad_(False)
        return cls(model if device is None else model.to(device), AutoTokenizer.from_pretrained(path))

    @no_grad
    def logits(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], batch_size: int = 32
    ) -> list[list[float]]:
        """The head's logit at every completion token, per completion (right-padded batches)."""
        import torch

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out: list[list[float]] = []
        for lo in range(0, len(prompt_ids), batch_size):
            rows = [
                p + c for p, c in zip(prompt_ids[lo : lo + batch_size], completion_ids[lo : lo + batch_size])
            ]
            width = max(len(r) for r in rows)
            ids_B_T = torch.full((len(rows), width), pad, dtype=torch.long)
            mask_B_T = torch.zeros((len(rows), width), dtype=torch.long)
            for b, r in enumerate(rows):
                ids_B_T[b, : len(r)] = torch.tensor(r)
                mask_B_T[b, : len(r)] = 1
            z_B_T = self.model(input_ids=ids_B_T.to(device), attention_mask=mask_B_T.to(device)).logits[
                ..., 0
            ]
            for b, p in enumerate(prompt_ids[lo : lo + batch_size]):
                n = len(completion_ids[lo + b])
                out.append(z_B_T[b, len(p) : len(p) + n].float().cpu().tolist())
        return out

    def step_scores(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        positions: list[list[int]],
        batch_size: int = 32,
    ) -> list[list[float]]:
        """sigma(z) at each step's last token (`positions`, as `step_token_ends` gives them; a token
        two steps share is scored once), per completion."""
        z = self.logits(prompt_ids, completion_ids, batch_size)
        return [[1 / (1 + math.exp(-zs[i])) for i in dict.fromkeys(pos)] for zs, pos in zip(z, positions)]

    def score(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        positions: list[list[int]],
        how: Aggregate = "min",
        batch_size: int = 32,
    ) -> list[float]:
        """One score per completion: its step scores aggregated by `how`."""
        return [
            aggregate(s, how) for s in self.step_scores(prompt_ids, completion_ids, positions, batch_size)
        ]

    def step_rewards(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], batch_size: int = 32
    ) -> list[TokenRewards]:
        """Per completion, its steps (`temper.tasks.steps.segment` of the ids decoded as the sampler
        decodes them) scored: sigma(z) at each step's last token, a token two steps share scored once
        (and listed once). The model runs in batches of `batch_size` over all the completions."""
        positions = []
        for ids in completion_ids:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            positions.append(list(dict.fromkeys(step_token_ends(self.tokenizer, ids, segment(text)))))
        scores = self.step_scores(prompt_ids, completion_ids, positions, batch_size)
        return [TokenRewards(tuple(p), tuple(s)) for p, s in zip(positions, scores, strict=True)]


@dataclass(frozen=True)
class TokenRewards:
    """Rewards placed on completion tokens: `values[k]` on token `positions[k]` (distinct, increasing
    positions into the completion ids). `total` is their sum: the return they add to the episode."""

    positions: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def total(self) -> float:
        return float(sum(self.values))


def reduce_steps(steps: TokenRewards, mode: Mode) -> float | TokenRewards:
    """The component's value of one completion: its step rewards as they are (dense), or one
    outcome score aggregated from them (min, product; `aggregate`)."""
    return steps if mode == "dense" else aggregate(steps.values, mode)


def prm_scorer(prm: Any, mode: Mode = "dense", batch_size: int = 32):
    """The `process_reward_model` batch component (a `temper.rewards.judge.GroupScorer`): every
    episode of a sampling round scored by the PRM in one batched no-grad pass. Per episode:
    `process_reward_model` (a `TokenRewards` in dense mode, which `grade_episodes` places on the
    tokens and logs as its total; else the min or product of the step scores), and, for the log,
    `prm_min` (the weakest step's score) and `prm_steps` (steps scored). Single-turn episodes only:
    an episode with environment tokens has no one completion to cut into steps."""

    def score(problems: list[Any], episodes: list[list[Any]]) -> list[list[dict[str, Any]]]:
        flat = [t for group in episodes for t in group]
        if multi := [t for t in flat if len(t.segments) > 2]:
            raise ValueError(
                f"the {PRM} reward scores single-turn completions; {len(multi)} episodes have several "
                "turns or environment tokens"
            )
        steps = iter(
            prm.step_rewards(
                [list(t.prompt_ids) for t in flat], [list(t.completion_ids) for t in flat], batch_size
            )
            if flat
            else []
        )
        out = []
        for group in episodes:
            row = []
            for _ in group:
                s = next(steps)
                row.append(
                    {
                        PRM: reduce_steps(s, mode),
                        "prm_min": min(s.values, default=0.0),
                        "prm_steps": len(s.values),
                    }
                )
            out.append(row)
        return out

    return score


def process_model_from(source: str | Path, pad_token_id: int):
    """A fresh PRM on `source`'s weights: the causal LM's backbone, a new one-output token head."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(str(source), num_labels=1)
    model.config.pad_token_id = pad_token_id
    return model
