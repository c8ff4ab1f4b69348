"""AdaptThink, the RL feature (`advantage: adaptthink` with the `adaptthink` block, Zhang et al.
2025; the advantage is `temper.algorithms.adaptthink`, the two-mode task `temper.tasks.two_mode`):
its settings and rules, the rollout that forces the first token (importance sampling), each
sample's mode, the reference accuracy of every training prompt, and its metrics.

- `ForcedFirstToken` wraps any `Sampler`: of the n samples of a prompt, round(n s) continue the
  prompt + the direct marker's first token and the rest the prompt + the thinking marker's; the
  forced token becomes the completion's first token with logprob log s (or log(1 - s)), the
  paper's pi_IS, so the loop's importance ratio pi_theta / pi_old at that token is pi_theta /
  pi_IS with no change to the loss. Later tokens keep the sampler's logprobs (pi_IS = pi_old).
- `reference_accuracy`: Rbar_ref(x), the starting model's mean accuracy over K thinking-mode
  samples of each prompt the run will train on (problems are a pure function of (seed, step), so
  they are known before the first update), as the paper pre-samples its reference responses
  (THU-KEG/AdaptThink `presampling_ref_responses.py`).
- The hooks (`AdaptThinkRun`): the reference accuracy before training, the forced sampler, per
  step the mode metrics and the estimator's inputs (each sample's mode, each prompt's reference
  accuracy, delta).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field

from temper import distributed
from temper.atomic import atomic_write_json
from temper.envs.base import make_env
from temper.lazy import no_grad
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import Sample, Sampler, StopsAtTokens, derive_seed, model_of, prompt_seeds
from temper.tasks.base import Problem, Task
from temper.tasks.two_mode import marker_ids
from temper.train.features.base import BatchExtras, Error, Hooks, RLFeature, RunStart, StageView, Step, at

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


@dataclass
class AdaptThinkConfig:
    """AdaptThink (Zhang et al. 2025, `temper.algorithms.adaptthink`): with `advantage: adaptthink`,
    the two modes of a `two_mode` task (`temper.tasks.two_mode`: a completion that starts with the
    thinking marker works before it answers, one that starts with `Answer:` answers directly)."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    delta: Annotated[float, Field(ge=0)] = 0.05
    """The bonus of a direct answer: A = delta * 1(direct) + r - Rbar_ref(x). Larger: more direct
    answers at more accuracy lost (the paper: 0.05 for its 1.5B and 7B models)."""
    direct_share: Annotated[float, Field(gt=0, lt=1)] | None = 0.5
    """Importance sampling at the first token: this share of each group starts with the direct
    marker and the rest with the thinking marker, the ratio taken against that share (the paper:
    0.5). null: sample the mode on-policy (a mode the policy stops choosing is never explored again)."""
    reference_samples: Annotated[int, Field(ge=1)] = 8
    """Thinking-mode samples of the starting model per training prompt, drawn before the first
    update, whose mean accuracy is Rbar_ref(x) (the paper: 16)."""


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

    @property
    def model(self) -> Any:
        """The backend's in-process model (`HoldsModel`), declared rather than left to
        `__getattr__`, which `isinstance` does not consult on Python 3.12+."""
        return model_of(self.inner)

    @property
    def stop_token_ids(self) -> Sequence[int]:
        """The backend's extra stop ids (`StopsAtTokens`); none when it has none."""
        return self.inner.stop_token_ids if isinstance(self.inner, StopsAtTokens) else ()

    def __getattr__(self, attr: str):
        if attr == "inner":  # not set yet (copy/pickle): never recurse
            raise AttributeError(attr)
        return getattr(self.inner, attr)  # the precision and the rest of the backend

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
    import torch

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


@no_grad
def direct_probability(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], tokenizer, temperature: float
) -> float:
    """Mean over `prompts` of pi(first token = the direct marker | prompt) at `temperature`: the
    policy's own choice of mode, which the forced rollouts (half and half) do not show."""
    import torch

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


def rules(config: Any, stage: StageView) -> list[Error]:
    """`advantage: adaptthink` and the `adaptthink` block go together; its forced first token
    needs both modes in every group, and its advantage a prompt set known before training, no KL
    in the reward and no process rewards."""
    at_ = config.adaptthink
    if config.advantage != "adaptthink":
        return at(("train",), [(("adaptthink",), "is read only with advantage 'adaptthink'")] if at_ else [])
    if at_ is None:
        return [
            (
                ("train", "adaptthink"),
                "advantage 'adaptthink' needs this block, e.g. {delta: 0.05, direct_share: 0.5}",
            )
        ]
    out: list[Error] = []
    if (
        at_.direct_share is not None
        and not 1 <= round(config.group_size * at_.direct_share) < config.group_size
    ):
        out.append(
            (
                ("adaptthink", "direct_share"),
                f"{at_.direct_share} of a group of {config.group_size} forces "
                f"{round(config.group_size * at_.direct_share)} samples to answer directly: each group needs both modes",
            )
        )
    if config.dynamic_sampling is not None:
        out.append(
            (
                ("dynamic_sampling",),
                "not with adaptthink: refills draw prompts without a reference accuracy (and a group "
                "whose rewards are all equal still learns which mode to prefer)",
            )
        )
    if config.kl_coef and config.kl_mode == "reward":
        out.append((("kl_mode",), "adaptthink takes no KL in the reward; use kl_mode: loss"))
    if config.rewards.get("process"):
        out.append(
            (("rewards", "process"), "adaptthink takes no process rewards: its advantage is per sample")
        )
    return at(("train",), out)


class AdaptThinkRun(Hooks):
    """AdaptThink in one run, given the reference accuracy of every prompt it trains on: the
    rollout that forces the first token; each step's mode metrics and the estimator's inputs."""

    def __init__(
        self, block: AdaptThinkConfig, tokenizer, model, temperature: float, ref_accuracy: dict[str, float]
    ):
        self.block, self.tokenizer, self.model = block, tokenizer, model
        self.temperature, self.ref_accuracy = temperature, ref_accuracy

    def sampler(self, sampler: Sampler) -> Sampler:
        if self.block.direct_share is None:
            return sampler
        return ForcedFirstToken(sampler, self.tokenizer, self.block.direct_share)

    def after_grading(self, step: Step) -> dict[str, Any]:
        if not step.groups:
            return {}
        row = step_metrics(step.groups, self.tokenizer, self.ref_accuracy)
        row["adaptthink/p_direct"] = direct_probability(
            self.model,
            [g.rollouts[0].trajectory.prompt_ids for g in step.local],
            self.tokenizer,
            self.temperature,
        )
        return row

    def extras(self, step: Step, batch: Any) -> BatchExtras:
        import torch

        rollouts = [r for g in step.local for r in g.rollouts]
        return BatchExtras(
            {
                "direct_R": direct_flags([first_token(r.trajectory) for r in rollouts], self.tokenizer),
                "ref_accuracy_G": torch.tensor(
                    [self.ref_accuracy[g.rollouts[0].problem.id] for g in step.local]
                ),
                "delta": self.block.delta,
            }
        )


def start(config: Any, run: RunStart) -> AdaptThinkRun | None:
    """With `advantage: adaptthink`: the reference accuracy of every prompt the run will train on,
    from the starting weights (a resumed run reads the file back), then the hooks."""
    if config.advantage != "adaptthink":
        return None
    assert config.adaptthink is not None, "advantage adaptthink without its block (rl_rules refuses it)"
    every = [p for step in range(config.steps) for p in run.problems(step)]
    ref_accuracy = distributed.on_main(
        reference_accuracy,
        run.sampler,
        run.tokenizer,
        every,
        config.adaptthink.reference_samples,
        run.limits,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
        out_dir=run.out_dir if run.main else None,
    )
    return AdaptThinkRun(config.adaptthink, run.tokenizer, run.model, config.temperature, ref_accuracy)


FEATURE = RLFeature(
    name="adaptthink",
    block=AdaptThinkConfig | None,
    doc="AdaptThink's settings (delta, importance sampling share, reference samples); needs "
    "`advantage: adaptthink` and a `two_mode` task.",
    order=10,
    rules=rules,
    start=start,
    hashed_when_set=True,
)
