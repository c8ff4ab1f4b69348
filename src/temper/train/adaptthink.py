"""AdaptThink in the RL loop (`advantage: adaptthink`, Zhang et al. 2025; the advantage is
`temper.algorithms.adaptthink`): the rollout that forces the first token (importance sampling),
each sample's mode, and the reference accuracy of every training prompt.

- `ForcedFirstToken` wraps any `Sampler`: of the n samples of a prompt, round(n s) continue the
  prompt + the direct marker's first token and the rest the prompt + the thinking marker's; the
  forced token becomes the completion's first token with logprob log s (or log(1 - s)), the
  paper's pi_IS, so the loop's importance ratio pi_theta / pi_old at that token is pi_theta /
  pi_IS with no change to the loss. Later tokens keep the sampler's logprobs (pi_IS = pi_old).
- `reference_accuracy`: Rbar_ref(x), the starting model's mean accuracy over K thinking-mode
  samples of each prompt the run will train on (problems are a pure function of (seed, step), so
  they are known before the first update), as the paper pre-samples its reference responses
  (THU-KEG/AdaptThink `presampling_ref_responses.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from temper.atomic import atomic_write_json
from temper.envs.base import make_env
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import Sample, Sampler, derive_seed, prompt_seeds
from temper.tasks.base import Problem, Task
from temper.tasks.two_mode import marker_ids

REFERENCE_FILE = "adaptthink_reference.json"
"""Under the stage's out folder: problem id -> the reference accuracy (read back on resume)."""


class ForcedFirstToken:
    """A `Sampler` whose completions start with a forced token: the direct marker in a share
    `direct_share` of each prompt's samples (the first ones), the thinking marker in the rest;
    see the module docstring. direct_share 0 forces every sample to think (the reference's
    samples) and 1 every sample to answer directly (a per-mode evaluation), with logprob log 1 = 0
    at the forced token."""

    def __init__(self, inner: Sampler, tokenizer, direct_share: float):
        if not 0.0 <= direct_share <= 1.0:
            raise ValueError(f"direct_share must be in [0, 1], got {direct_share}")
        self.inner = inner
        self.tokenizer = tokenizer
        self.direct_share = direct_share
        self.direct_id, self.think_id = marker_ids(tokenizer)

    def __getattr__(self, attr: str):
        if attr == "inner":  # not set yet (copy/pickle): never recurse
            raise AttributeError(attr)
        return getattr(self.inner, attr)  # the model, precision, stop ids of the backend

    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] = (),
        seed: int | Sequence[int] = 0,
    ) -> list[list[Sample]]:
        if max_new_tokens < 2:
            raise ValueError("a forced first token needs max_new_tokens >= 2")
        seeds = prompt_seeds(seed, len(prompts))
        n_direct = round(n * self.direct_share)
        out: list[list[Sample]] = [[] for _ in prompts]
        for token, count, share, stream in (
            (self.direct_id, n_direct, self.direct_share, 1),
            (self.think_id, n - n_direct, 1.0 - self.direct_share, 2),
        ):
            if count == 0:
                continue
            drawn = self.inner.sample(
                [p + [token] for p in prompts],
                count,
                max_new_tokens=max_new_tokens - 1,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                stop=stop,
                seed=[derive_seed(s, stream) for s in seeds],
            )
            head = self.tokenizer.decode([token])
            for i, samples in enumerate(drawn):
                out[i] += [
                    Sample(
                        list(prompts[i]),
                        [token, *s.token_ids],
                        [math.log(share), *s.logprobs],
                        head + s.text,
                        s.stop_reason,
                    )
                    for s in samples
                ]
        return out

    def sync(self, model: torch.nn.Module) -> None:
        self.inner.sync(model)


def direct_flags(first_tokens: Sequence[int | None], tokenizer) -> torch.Tensor:
    """bool (R,): which samples answered in the direct mode (first completion token = the direct
    marker's first token; None: an empty completion, not direct)."""
    direct_id = marker_ids(tokenizer)[0]
    return torch.tensor([t == direct_id for t in first_tokens], dtype=torch.bool)


def reference_accuracy(
    sampler: Sampler,
    tokenizer,
    drawn: list[tuple[Task, Problem]],
    k: int,
    limits: EpisodeLimits,
    *,
    temperature: float,
    top_p: float,
    seed: int,
    out_dir: Path | None = None,
) -> dict[str, float]:
    """problem id -> mean accuracy of k thinking-mode samples of `sampler`'s model (call it before
    the first update: the starting model is the reference). Each distinct problem is sampled once
    with a seed derived from (seed, its id), so the figures do not depend on the order or the
    repeats of `drawn`. Written to `out_dir/REFERENCE_FILE` and read back from there when present
    (a resumed run's sampler no longer holds the starting weights)."""
    path = out_dir / REFERENCE_FILE if out_dir is not None else None
    if path is not None and path.exists():
        known = json.loads(path.read_text())
        if all(p.id in known for _, p in drawn):
            return known
    unique = list({p.id: (t, p) for t, p in drawn}.values())
    forced = ForcedFirstToken(sampler, tokenizer, 0.0)
    envs = [[make_env(task, problem) for _ in range(k)] for task, problem in unique]
    seeds = [derive_seed(seed, _id_number(p.id)) for _, p in unique]
    episodes = run_episodes(forced, tokenizer, envs, seeds, limits, temperature=temperature, top_p=top_p)
    accuracy = {
        p.id: sum(bool(t.score is not None and t.score.correct) for t in group) / k
        for (_, p), group in zip(unique, episodes, strict=True)
    }
    if path is not None:
        atomic_write_json(path, accuracy)
    return accuracy


def _id_number(problem_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(problem_id.encode(), digest_size=8).digest(), "little")


@torch.no_grad()
def direct_probability(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], tokenizer, temperature: float
) -> float:
    """Mean over `prompts` of pi(first token = the direct marker | prompt) at `temperature`: the
    policy's own choice of mode, which the forced rollouts (half and half) do not show."""
    direct_id = marker_ids(tokenizer)[0]
    device = next(model.parameters()).device
    t = temperature if temperature > 0 else 1.0
    total = 0.0
    for prompt in prompts:
        logits = model(input_ids=torch.tensor([list(prompt)], device=device), use_cache=False).logits[0, -1]
        total += float(torch.softmax(logits.float() / t, dim=-1)[direct_id])
    return total / max(len(prompts), 1)


def step_metrics(groups, tokenizer, ref_accuracy: dict[str, float]) -> dict[str, float]:
    """Per mode: share of the step's samples, accuracy and length; the prompts' reference accuracy."""
    rollouts = [r for g in groups for r in g.rollouts]
    direct = direct_flags([first_token(r.trajectory) for r in rollouts], tokenizer).tolist()
    row = {
        "adaptthink/direct_samples": sum(direct) / len(rollouts),
        "adaptthink/ref_accuracy": sum(ref_accuracy[g.rollouts[0].problem.id] for g in groups) / len(groups),
    }
    for name, want in (("direct", True), ("think", False)):
        chosen = [r for r, d in zip(rollouts, direct, strict=True) if d == want]
        if chosen:
            row[f"adaptthink/accuracy_{name}"] = sum(r.score.correct for r in chosen) / len(chosen)
            row[f"adaptthink/length_{name}"] = sum(r.tokens for r in chosen) / len(chosen)
    return row


def first_token(trajectory) -> int | None:
    """The completion's first token (None: empty)."""
    ids = trajectory.completion_ids
    return ids[0] if ids else None
