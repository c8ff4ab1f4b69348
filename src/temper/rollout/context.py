"""A context budget for agent episodes: what the harness does when a row's context would overflow.

    policy = ContextPolicy(max_tokens=256, on_overflow="summarise")   # an env's `context`

A long episode's conversation grows by an action and an observation every turn; a model with a
fixed window (the tiny default reads 512 positions) or a harness with a token budget must
compact it. The agent loop (`rollout/loop.py`) checks after every observation whether the row
could still hold the next action, `len(row) + max_new_tokens > max_tokens`, and if not compacts
the conversation, which starts a new training row (`Trajectory.rows`). `max_tokens` is the
threshold, as in slime's and Cursor's compaction: a summary the harness asks for is sampled past
it, so a row holds at most max_tokens + the request + summary_max_tokens (keep that under the
model's window).

- `truncate`: no summary; the new row's prompt is the head (the system messages and the task, the
  first user message) and the latest turns that fit (`truncated`). What the dropped turns showed
  is gone.
- `summarise`: the harness asks the policy for a summary (a user turn with the fixed
  `instruction`, `summary_request`); the policy's reply is sampled like an action (its tokens
  trained with their logprobs, the request masked) but not sent to the env; the new row's prompt
  is the head, the summary as the policy's own turn and the latest observation (`summarised`).
  Cursor's self-summaries and slime's / Agent Lightning's compaction do this; the summary is then
  trained by the outcome alone (every row of an episode has the episode's one advantage), or by
  its own reward too when the env grades summaries (`GradesSummaries`, the `summary` reward
  component).
- `end`: the episode ends there (stop reason max_tokens, signal `context_overflow`, graded as
  unfinished): the budget is a hard limit the policy must manage itself, e.g. by pruning its own
  context with an action whose env rewrites the history (`envs/prune_lookup.py`).

What was sampled is never re-tokenised into a trained row: the summary's tokens are trained in
the row that sampled them and are prompt tokens of the next. The functions here are pure over
chat messages, so an environment task can build demonstrations of the same shape the loop makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

OnOverflow = Literal["truncate", "summarise", "end"]

INSTRUCTION = "Context full. Write a short note of what you must remember."
"""The summary request's text: fixed, so the policy can learn to answer it."""


@dataclass(frozen=True)
class ContextPolicy:
    """max_tokens: a row's tokens (its prompt and everything after it) the loop keeps within;
    0: no budget. on_overflow: truncate | summarise | end. summary_max_tokens: the summary's sampler
    allowance. instruction: the summary request's text."""

    max_tokens: int = 0
    on_overflow: OnOverflow = "summarise"
    summary_max_tokens: int = 32
    instruction: str = INSTRUCTION

    def __post_init__(self) -> None:
        if self.max_tokens < 0 or self.summary_max_tokens < 1:
            raise ValueError(
                f"need max_tokens >= 0 and summary_max_tokens >= 1, got {self.max_tokens} and "
                f"{self.summary_max_tokens}"
            )
        if self.on_overflow not in ("truncate", "summarise", "end"):
            raise ValueError(f"on_overflow is truncate, summarise or end, not {self.on_overflow!r}")

    @property
    def on(self) -> bool:
        return self.max_tokens > 0


def head(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What compaction always keeps: the leading system messages and the first user message (the task)."""
    out = []
    for m in messages:
        out.append(m)
        if m.get("role") == "user":
            break
    return out


def summary_request(policy: ContextPolicy) -> dict[str, Any]:
    """The harness's turn that asks for a summary."""
    return {"role": "user", "content": policy.instruction}


def summarised(messages: list[dict[str, Any]], summary: str) -> list[dict[str, Any]]:
    """The conversation after a summary: the head, the summary as the policy's own turn, and the
    latest observation (the last message, which the next action answers). `messages` is the
    conversation before the summary request."""
    kept = head(messages)
    last = messages[-1] if len(messages) > len(kept) else None
    return [*kept, {"role": "assistant", "content": summary}, *([last] if last else [])]


def truncated(
    messages: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The head and the latest turns that fit: turns after the head are dropped oldest first, an
    assistant turn with the observations that answered it, until `fits(conversation)`; the latest
    observation is always kept (the next action answers it)."""
    kept = head(messages)
    rest = messages[len(kept) :]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "assistant"]
    for i in starts:
        if fits(kept + rest[i:]):
            return kept + rest[i:]
    tail = [m for m in rest[starts[-1] :] if m.get("role") != "assistant"] if starts else rest
    return kept + tail
