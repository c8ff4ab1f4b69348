"""Named reward components: each maps one graded completion to a float.

The total reward is sum_c w_c * r_c over the components a recipe names; the trainer logs every
r_c separately so a rising total can be traced to its cause (e.g. format reward rising while
the outcome stays flat is a visible reward hack, not progress).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from temper.tasks.base import Score


@dataclass(frozen=True)
class RewardInput:
    score: Score  # the task verifier's grade
    length: int  # completion tokens
    max_new_tokens: int
    truncated: bool  # stopped by the length limit, not by EOS or a stop string
    overlong_buffer: int = 0  # DAPO soft overlong window (tokens before the limit)
    process: float = 0.0  # the episode's summed per-step rewards from its environment
    summary: float = 0.0  # the mean of the env's grades of the episode's self-summaries (0: none)


def outcome(x: RewardInput) -> float:
    """The task verifier's reward (1 correct, 0 otherwise for the built-in tasks)."""
    return x.score.reward


def format_reward(x: RewardInput) -> float:
    """1 when an answer could be parsed in the required format, else 0."""
    return 1.0 if x.score.parsed else 0.0


def overlong(x: RewardInput) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), as a penalty in [-1, 0]:

        0                              if L <= L_max - L_buffer
        ((L_max - L_buffer) - L) / L_buffer   if L_max - L_buffer < L <= L_max
        -1                             if truncated (L > L_max: the answer never finished)

    With no buffer only truncation is penalized."""
    if x.truncated:
        return -1.0
    if x.overlong_buffer <= 0:
        return 0.0
    start = x.max_new_tokens - x.overlong_buffer
    return min(0.0, (start - x.length) / x.overlong_buffer)


def process(x: RewardInput) -> float:
    """The environment's per-step (process) rewards summed over the episode, e.g. treasure_hunt's
    reward for getting closer; 0 for single-turn tasks. Logged apart from the outcome, so a
    policy that farms step rewards without finishing shows as process up, outcome flat."""
    return x.process


def summary(x: RewardInput) -> float:
    """The mean of the environment's grades of the episode's self-summaries (`GradesSummaries`,
    under a context budget, `temper.rollout.context`; 0 for an episode with none): a reward on
    the summary itself (the facts needed later kept), beside the outcome that trains it anyway."""
    return x.summary


COMPONENTS: dict[str, Callable[[RewardInput], float]] = {
    "outcome": outcome,
    "format": format_reward,
    "overlong": overlong,
    "process": process,
    "summary": summary,
}


BATCH_COMPONENTS: dict[str, str] = {
    "reward_model": "a learned reward model's score of (prompt, completion), `train.reward_model`",
    "judge": "a generative judge's verdict, `train.judge`",
    "process_reward_model": "a process reward model's step scores (per token with advantage gae, or "
    "their min / product), `train.process_reward_model`",
}
"""Components scored over a batch of completions, not by a pure function of one graded completion:
the RL loop scores each sampling round at once (`temper.train.rollouts.given_parts`) and hands the
values to `grade_episodes`. Name -> what it is (for error messages)."""


def combine(
    x: RewardInput, weights: dict[str, float], given: dict[str, float] | None = None
) -> tuple[float, dict[str, float]]:
    """(total, {component: unweighted value}) for the components named in `weights`. `given` holds
    the values of the batch components (`BATCH_COMPONENTS`: a reward model's score, a judge's
    verdict), computed for the whole round beforehand and used as they are; its other keys (e.g.
    judge_parsed) are kept in the parts, unweighted."""
    given = given or {}
    if missing := [n for n in weights if n in BATCH_COMPONENTS and n not in given]:
        raise ValueError(f"reward component {missing[0]!r} needs its scorer ({BATCH_COMPONENTS[missing[0]]})")
    parts = {name: given[name] if name in given else COMPONENTS[name](x) for name in weights}
    parts |= {k: v for k, v in given.items() if k not in parts}
    return sum(weights[name] * parts[name] for name in weights), parts
