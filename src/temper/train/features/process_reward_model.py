"""A process reward model as an RL reward, the feature `process_reward_model: {model, mode}`: the
`process_reward_model` batch component (`temper.rewards.process_reward_model.prm_scorer`). Each
sampled completion is cut into steps (`temper.tasks.steps`) and every step scored, batched and
without gradients, by an earlier `process_reward_model` stage's model (or a folder saved by one).

dense: each step's score is a reward on the token that ends it (`Rollout.token_rewards`), which
only a per-token estimator (GAE) credits step by step; min / product: one outcome score per
completion, for any estimator (Lightman et al. 2023). The run also logs `reward/gold`, the
verifier's reward of every sample, and `prm/min_step`, `prm/steps`.

The block replaced the flat keys `process_reward_model` (the model) and
`process_reward_model_mode`; the stage hash covers it in that form (`hashed`), so runs recorded
before stay complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict

from temper.envs.base import EnvTask
from temper.models.tokenizer import tokenizer_mismatch
from temper.rewards.process_reward_model import (
    PRM,
    PROCESS_REWARD_MODEL_DIR,
    Mode,
    ProcessRewardModel,
    prm_scorer,
)
from temper.tasks.base import Task
from temper.train.features.base import Error, Hooks, RLFeature, ScorerSetup, SetupError, Step, Use


@dataclass
class ProcessRewardModelSpec:
    """The process reward model of the `process_reward_model` component, and how its step scores
    become rewards."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    model: str
    """An earlier `process_reward_model` stage's name (its `<out>/process_reward_model` folder) or a
    folder saved by one (relative to the recipe)."""
    mode: Mode = "dense"
    """dense: each step's score is a reward on the token that ends the step (`advantage: gae`
    only, which credits it per token); min / product: the step scores aggregated into one outcome
    score per completion (Lightman et al. 2023), for any estimator."""


def rules(config: Any, stage: Any) -> list[Error]:
    """A `process_reward_model` component needs the block (and the reverse), and its dense mode a
    per-token estimator: an outcome estimator would credit the sum of the step scores to the
    whole completion, which pays for writing more steps, not better ones."""
    spec, used = config.process_reward_model, PRM in config.rewards
    if used and spec is None:
        return [
            (
                ("train", "rewards", PRM),
                "the process_reward_model component needs a process reward model: set "
                "train.process_reward_model: {model: <an earlier process_reward_model stage's name or a folder saved by one>}",
            )
        ]
    if spec is not None and not used:
        return [
            (
                ("train", PRM),
                f"{spec.model!r} is never used: no process_reward_model component in "
                "train.rewards (e.g. rewards: {outcome: 1.0, process_reward_model: 0.5})",
            )
        ]
    if used and spec.mode == "dense" and config.advantage != "gae":
        return [
            (
                ("train", PRM, "mode"),
                f"dense step rewards need a per-token estimator (advantage: gae); advantage "
                f"{config.advantage!r} gives one advantage per sample, which would see only the sum of "
                "the step scores (more steps, more reward). Use min or product: the step scores "
                "aggregated into one outcome score (Lightman et al. 2023)",
            )
        ]
    return []


def task_rules(config: Any, tasks: dict[str, Task]) -> list[Error]:
    if PRM in config.rewards and (envs := [n for n, t in tasks.items() if isinstance(t, EnvTask)]):
        return [
            (
                ("train", "rewards", PRM),
                f"a process reward model scores the steps of single-turn completions; {envs} are environment tasks",
            )
        ]
    return []


def uses(config: Any) -> list[Use]:
    spec = config.process_reward_model
    return [] if spec is None else [(("train", PRM, "model"), spec.model, PRM)]


def scorers(config: Any, setup: ScorerSetup) -> dict[str, Any]:
    spec = config.process_reward_model
    if spec is None:
        return {}
    prm = ProcessRewardModel.load(setup.folder(spec.model, PROCESS_REWARD_MODEL_DIR), device=setup.device)
    if problem := tokenizer_mismatch(setup.tokenizer, prm.tokenizer):
        raise SetupError(
            f"train.process_reward_model {spec.model!r} does not share the policy's tokenizer "
            f"({problem}); it scores the policy's token ids"
        )
    return {PRM: prm_scorer(prm, spec.mode)}


def hashed(config: Any) -> dict[str, Any]:
    """The flat keys the stage hash covered before the block (each left out at its default)."""
    spec = config.process_reward_model
    if spec is None:
        return {}
    return {PRM: spec.model} | ({"process_reward_model_mode": spec.mode} if spec.mode != "dense" else {})


def moved(train: dict[str, Any]) -> list[Error]:
    if "process_reward_model_mode" in train:
        return [
            (
                ("train", "process_reward_model_mode"),
                "moved into the process_reward_model block: "
                "process_reward_model: {model: NAME, mode: dense | min | product}",
            )
        ]
    if isinstance(name := train.get(PRM), str):
        return [
            (
                ("train", PRM),
                f"is a block: process_reward_model: {{model: {name}, mode: dense | min | product}}",
            )
        ]
    return []


class StepScores(Hooks):
    """The weakest step's score and the steps scored, per sample."""

    def after_grading(self, step: Step) -> dict[str, Any]:
        rollouts = [r for g in step.groups for r in g.rollouts]
        if not rollouts or "prm_min" not in rollouts[0].parts:
            return {}
        n = len(rollouts)
        return {
            "prm/min_step": sum(r.parts["prm_min"] for r in rollouts) / n,
            "prm/steps": sum(r.parts["prm_steps"] for r in rollouts) / n,
        }


def _describe(config: Any) -> str:
    spec = config.process_reward_model
    return f", process reward model {spec.model!r} ({spec.mode})" if spec else ""


FEATURE = RLFeature(
    name=PRM,
    block=ProcessRewardModelSpec | None,
    doc="The process reward model the `process_reward_model` component scores with: {model: an "
    "earlier process_reward_model stage or a folder saved by one, mode: dense | min | product}.",
    order=31,
    rules=rules,
    task_rules=task_rules,
    uses=uses,
    describe=_describe,
    summary=lambda config, folder: (
        {PRM: str(folder(config.process_reward_model.model, PROCESS_REWARD_MODEL_DIR))}
        if config.process_reward_model
        else {}
    ),
    hashed=hashed,
    moved=moved,
    scorers=scorers,
    start=lambda config, run: StepScores() if PRM in config.rewards else None,
)
