"""Bounded-staleness rollouts as an RL setting, `async_rollouts: {max_staleness, worker}`
(the schedule and the worker are `temper.train.pipeline`).

With `max_staleness: k > 0` the batch of step s is sampled (episodes run, graded) with the weights
after update max(0, s - k), by a worker that runs while the trainer trains the steps before s: a
fixed schedule, so a run is reproducible and a resume regenerates the batches in flight exactly.
`max_staleness: 0` is the lockstep loop (sample, grade, train, sync), byte for byte.

The samples of a stale batch are off-policy by k updates. Without a correction the PPO ratio is
taken against their behaviour logprobs (the clip bounds the step, as in verl's one-step
off-policy mode); with `rollout_correction` (e.g. `mode: token_mask`, AReaL's decoupled
objective with its cap) the ratio is against the trainer's logprobs at the start of the update
(the proximal policy) and the behaviour-to-proximal weight is truncated or masked. More than one
minibatch per step adds staleness inside the step (minibatch m trains after m optimizer steps),
as in the synchronous loop; `async/staleness` counts the updates between sampling and the step's
first optimizer step. Nothing is dropped for being stale, so long episodes keep their share.

Refused (the rules below): tasks whose sampling follows the training (a failure curriculum: the
worker would not see the pool grow), a judge that is the policy (it would grade with other
weights than it samples with) and a sequence-level correction (its cap bears on long episodes
more: a length bias).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from temper.tasks.base import curriculum_of
from temper.train.features.base import Error, RLFeature


@dataclass
class AsyncRollouts:
    """Sampling overlapped with training, at most `max_staleness` updates behind."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_staleness: Annotated[int, Field(ge=0)] = 0
    """k: step s trains on episodes sampled with the weights after update max(0, s - k) (0: the
    lockstep loop, sample -> train -> sync)."""
    worker: Literal["process", "thread"] = "process"
    """Where the sampling runs: a forked process with its own copy of the model and one torch
    thread (on a CPU: the trainer keeps the other cores) or a thread of this process (a CUDA
    model, which cannot be forked; a vLLM sampler, whose engine the thread drives and syncs with
    each job's weights; the GIL limits the overlap of an in-process model on a CPU)."""
    in_flight: Literal["finish", "continue"] = "finish"
    """An episode in flight when the trainer hands over newer weights: finishes under the weights
    its batch started with (finish, the default: the schedule stays fixed and a run reproduces
    byte for byte), or takes the newer weights at its next turn (continue: partial rollouts, each
    turn recording its version; timing decides which turns, so runs are not reproducible; needs a
    `rollout_correction` mode). The weights change between sampler calls only, never inside a
    generation, so a single-turn episode is never split; with continue it may still be sampled
    with newer weights than its step's schedule (a later sampler call of the batch, or a job that
    starts after newer ones arrived), and its row records the version that sampled it."""


def task_rules(config: Any, tasks: dict[str, Any]) -> list[Error]:
    block: AsyncRollouts = config.async_rollouts
    if not block.max_staleness:
        return []
    return [
        (
            ("train", "async_rollouts", "max_staleness"),
            f"task {name!r} grows its curriculum from each step's failures, which a worker sampling "
            f"{block.max_staleness} step(s) ahead would not see: use max_staleness: 0 with it",
        )
        for name, task in tasks.items()
        if curriculum_of(task) is not None
    ]


def rules(config: Any, stage: Any) -> list[Error]:
    block: AsyncRollouts = config.async_rollouts
    if not block.max_staleness:
        if block.in_flight == "continue":
            return [
                (
                    ("train", "async_rollouts", "in_flight"),
                    "in_flight: continue with max_staleness 0: nothing is in flight in the lockstep loop "
                    "(set max_staleness >= 1, or drop in_flight)",
                )
            ]
        return []
    out: list[Error] = []
    if block.in_flight == "continue" and config.rollout_correction.mode == "off":
        out.append(
            (
                ("train", "async_rollouts", "in_flight"),
                "in_flight: continue without a correction: episodes whose turns were sampled by several "
                "weights versions need rollout_correction (e.g. mode: token_mask), whose ratio against "
                "the proximal policy bounds each stale token's weight",
            )
        )
    judge = getattr(config, "judge", None)
    if judge is not None and getattr(judge, "model", None) == "policy":
        out.append(
            (
                ("train", "async_rollouts", "max_staleness"),
                "a judge that is the policy grades with the trainer's weights while the worker samples with "
                "older ones: use max_staleness: 0, or a frozen judge model",
            )
        )
    mode = config.rollout_correction.mode
    if mode.startswith("sequence"):
        out.append(
            (
                ("train", "rollout_correction", "mode"),
                f"{mode!r} with max_staleness {block.max_staleness}: a stale sequence's weight is the product of "
                "its token ratios, whose log grows with its length, so the cap would drop or shrink long episodes "
                "more than short ones (the length bias async must not add; TRL #4772): use token_truncate or "
                "token_mask",
            )
        )
    return out


def describe(config: Any) -> str:
    block: AsyncRollouts = config.async_rollouts
    if not block.max_staleness:
        return ""
    partial = ", episodes continue under newer weights" if block.in_flight == "continue" else ""
    return f", rollouts up to {block.max_staleness} update(s) stale ({block.worker} worker{partial})"


FEATURE = RLFeature(
    name="async_rollouts",
    block=AsyncRollouts,
    default=AsyncRollouts,
    doc="Sampling overlapped with training: step s trains on episodes sampled with the weights "
    "after update s - max_staleness, by a worker process (or thread); a fixed, reproducible schedule.",
    order=90,
    rules=rules,
    task_rules=task_rules,
    describe=describe,
    summary=lambda config, folder: {"async_rollouts": asdict(config.async_rollouts)},
    hashed_when_set=True,
)
