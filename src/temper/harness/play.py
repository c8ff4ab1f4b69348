"""A frozen model playing a task's problems through a harness: greedy episodes and their traces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from temper.envs.base import make_env
from temper.harness.env import HarnessEnv
from temper.harness.file import Harness
from temper.harness.search import scores_of
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import Sampler
from temper.rollout.trajectory import Trajectory
from temper.tasks.base import Problem, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def trace(problem: Problem, t: Trajectory, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """One episode in full: its grade, why it ended, and every segment as text (special tokens
    kept), `by` the prompt, the policy or the environment (what the harness showed)."""
    score = t.score
    by = ["prompt"] + ["policy" if s.trainable else "env" for s in t.segments[1:]]
    return {
        "problem": problem.id,
        "correct": bool(score and score.correct),
        "reward": float(score.reward) if score else 0.0,
        "stop_reason": t.stop_reason,
        "turns": t.turns,
        "error": t.error,
        "episode": [
            {"by": who, "text": tokenizer.decode(s.token_ids, skip_special_tokens=False)}
            for who, s in zip(by, t.segments, strict=True)
        ],
    }


def play_episodes(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: Sequence[Problem],
    harness: Harness,
    info: dict[str, Any],
    limits: EpisodeLimits,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every problem played once, greedily, through `harness` -> (scores, traces)."""
    envs = [[HarnessEnv(make_env(task, p), harness, {**info, "split": p.split}, p.id)] for p in problems]
    groups = run_episodes(sampler, tokenizer, envs, [0] * len(problems), limits, temperature=0.0)
    traces = [trace(p, g[0], tokenizer) for p, g in zip(problems, groups, strict=True)]
    return scores_of(traces), traces
