"""A `Trajectory`: one episode as token-exact segments, what the policy sampled and what the
environment inserted, plus per-step rewards, signals and the outcome.

Segments concatenate to the exact token sequence the policy read and wrote. Policy segments keep
the sampler's token ids verbatim with their logprobs (never re-tokenized from text, which would
misalign the importance ratio's denominator); prompt and environment segments have no logprobs
and are never trained on. `turn` numbers the policy's actions (0, 1, ...): every token of a
policy segment belongs to the action whose text `Env.step` received; env and prompt segments
have turn -1.

An episode is one training row unless its history was rewritten (an agent that dropped, edited or
summarised earlier turns, `StepResult.history`): the rendered conversation then no longer
extends the tokens so far, and a segment with `starts_row` begins a new row whose prompt is
that rendering. Each row is a maximal run of turns whose tokens extend each other (tinker's
rule: a render that is not a prefix of what was sampled starts a new datum); `rows` splits the
episode into them, and the trainer makes each its own batch row (`train/rollouts.to_batch`).
What was sampled is never re-tokenised into a trained row: the policy's earlier turns, as the
new prompt renders them, are prompt tokens of the new row. A context budget (`rollout/context.py`)
splits an episode the same way: each compaction (a truncation, or a self-summary, a policy
segment sampled at the harness's request and trained in the row that sampled it) starts a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from temper.tasks.base import Score

StopReason = Literal[
    "done",  # the environment ended the episode
    "max_turns",  # the turn limit
    "max_tokens",  # the episode's token budget (prompt excluded)
    "length",  # a policy turn hit max_new_tokens without ending its turn
    "timeout",  # an environment step ran past its time limit
    "env_error",  # the environment raised (an infrastructure error, counted, never a reward)
    "not_prefix",  # the chat template re-rendered the history differently from what was sampled
    "bad_tokens",  # the policy's turn held a special token or bytes that text cannot hold
]


@dataclass
class Segment:
    token_ids: list[int]
    logprobs: list[float] | None  # the sampler's, one per token, for policy segments only
    trainable: bool  # policy tokens: in the loss; prompt and environment tokens: never
    turn: int = -1  # the policy action this segment belongs to; -1 for prompt and environment
    starts_row: bool = False  # the prompt of a new row (segments[0] always starts the first)
    policy_version: int | None = None  # policy segments: the weights version that sampled it, if tagged
    why: str = (
        ""  # "summary": a self-summary (policy) or the row it starts; "truncate": a truncated row's prompt
    )


@dataclass
class Trajectory:
    """segments[0] is the prompt (of the first row). `step_rewards[k]` / `signals[k]` are the
    env's answer to action k. The token views below (`completion_ids`, `trainable_mask`, ...)
    run over every row's completion in order, each row's own prompt left out, so a row-split
    episode's positions are those of its rows' completions laid end to end."""

    segments: list[Segment]
    step_rewards: list[float] = field(default_factory=list)
    signals: list[dict[str, Any]] = field(default_factory=list)
    score: Score | None = None  # the outcome grade (None when the episode ended before one)
    stop_reason: StopReason = "done"
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation as text, for logs
    seconds_in_env: float = 0.0  # the episode's own environment step time (steps run in parallel)
    last_stop: str = "eos"  # how the last sampler call ended: eos | stop | length (a truncated turn)
    summaries: list[str] = field(default_factory=list)  # the policy's self-summaries (a context budget)
    summary_rewards: list[float] = field(default_factory=list)  # the env's grade of each, when it grades them

    @property
    def prompt_ids(self) -> list[int]:
        return self.segments[0].token_ids

    @property
    def rows(self) -> list[Trajectory]:
        """The episode's training rows, in order: [self] unless its history was rewritten; else
        one view per row (its segments, its prompt first; the episode's other fields shared)."""
        starts = [0] + [i for i, s in enumerate(self.segments) if i and s.starts_row]
        if len(starts) == 1:
            return [self]
        ends = [*starts[1:], len(self.segments)]
        return [replace(self, segments=self.segments[a:b]) for a, b in zip(starts, ends, strict=True)]

    def _completion(self) -> list[Segment]:
        return [s for s in self.segments[1:] if not s.starts_row]

    @property
    def completion_ids(self) -> list[int]:
        """Everything after the prompt: policy and environment tokens in order (of every row)."""
        return [t for s in self._completion() for t in s.token_ids]

    @property
    def trainable_mask(self) -> list[bool]:
        return [s.trainable for s in self._completion() for _ in s.token_ids]

    @property
    def completion_logprobs(self) -> list[float]:
        """The sampler's logprobs at policy tokens, 0.0 at environment tokens."""
        return [lp for s in self._completion() for lp in (s.logprobs or [0.0] * len(s.token_ids))]

    @property
    def token_turns(self) -> list[int]:
        """The action index of every completion token (-1 for environment tokens)."""
        return [s.turn for s in self._completion() for _ in s.token_ids]

    @property
    def policy_versions(self) -> list[int | None]:
        """The weights version of each policy turn, in order (None where the sampler did not tag
        it): several values when the weights changed between the episode's turns."""
        return [s.policy_version for s in self.segments if s.trainable]

    @property
    def truncated(self) -> bool:
        """The last policy turn hit max_new_tokens (graded all the same when the env ended it)."""
        return self.last_stop == "length"

    @property
    def turns(self) -> int:
        return 1 + max((s.turn for s in self.segments), default=-1)

    @property
    def policy_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.trainable)

    @property
    def error(self) -> str:
        """Why the episode failed, in one line: the last step's `error` signal ('' when none; the
        agent loop puts one there for every env_error and timeout, naming the env and the call)."""
        return next((str(s["error"]) for s in reversed(self.signals) if s.get("error")), "")


ROW_CAUSES = {"summary": "summarised", "truncate": "truncated", "": "rewritten"}
"""What started a row, by its first segment's `why`: a self-summary, a truncation (a context
budget, `rollout/context.py`) or the env's rewritten history."""


def segment_records(t: Trajectory, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """An episode's segments after its prompt, for logs and the report: each {"by": "policy" |
    "env", "text"}, a self-summary's `summary: true`; an episode of several rows also each
    segment's `row`, and the first of a row `row_start` and `cause` (`ROW_CAUSES`)."""
    records = []
    row = 0
    several = any(s.starts_row for s in t.segments)
    for s in t.segments[1:]:
        record: dict[str, Any] = {"by": "policy" if s.trainable else "env", "text": decode(s.token_ids)}
        if s.trainable and s.why == "summary":
            record["summary"] = True
        if several:
            row += s.starts_row
            record["row"] = row
            if s.starts_row:
                record |= {"row_start": True, "cause": ROW_CAUSES.get(s.why, "rewritten")}
        records.append(record)
    return records


def mean_signals(trajectories: list[Trajectory]) -> dict[str, float]:
    """Every numeric step signal (tool calls, tool errors, invalid moves...) summed over each
    episode, then averaged over the episodes; strings (a sandbox tier, an error) are left out.
    The RL metrics and the eval summary both report these."""
    sums: dict[str, float] = {}
    for t in trajectories:
        for signals in t.signals:
            for k, v in signals.items():
                if isinstance(v, bool | int | float):
                    sums[k] = sums.get(k, 0.0) + float(v)
    return {k: v / len(trajectories) for k, v in sorted(sums.items())}
