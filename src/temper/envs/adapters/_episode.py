"""Bookkeeping the text adapters of action-space environments share (gymnasium, OpenEnv).

Both turn a text action into the environment's action with a user parser; the episode's messages,
the invalid-action convention, the step limit, the return and the final Score are the same, so
they live here once and each adapter only drives its backend.

The invalid-action convention mirrors treasure_hunt's: an answer the parser rejects (None) is not
sent to the environment (it has no "invalid" action); the step counts (`invalid_moves`, and
towards `max_steps`), the optional `invalid_penalty` is this step's reward and part of the
return, and the observation is shown again after `invalid_message`, so the policy can retry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temper.envs.base import StepResult
from temper.tasks.base import Score

INVALID_MESSAGE = "Invalid action; the environment did not move. Try again."
INSTRUCTION_PLACES = ("system", "prefix")


def default_success(terminated: bool, reward: float, info: dict[str, Any]) -> bool:
    """Correct = the environment ended the episode itself on a positive last reward (reaching a
    goal), not a time limit and not a terminal failure (a trap, a crash)."""
    return terminated and reward > 0


def scalar_signals(info: dict[str, Any]) -> dict[str, Any]:
    """The entries of an env's `info` that are logged as step signals: numbers, booleans, None and
    one-line strings up to 80 characters (positions, arrays, dicts and rendered text are left out)."""
    return {k: v for k, v in info.items() if isinstance(k, str) and _is_signal(v)}


def _is_signal(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= 80 and "\n" not in value
    return value is None or isinstance(value, (bool, int, float))


@dataclass
class TextEpisode:
    """One episode's turns, counts and outcome.

    instructions: told once, as a system message (`place="system"`) or before the first
        observation in the user turn (`"prefix"`, for chat templates without a system role).
    max_steps: a limit on ALL actions, invalid ones included (the env's own time limit counts only
        the actions it saw); None: the env's limit and the agent loop's max turns.
    success(terminated, last_reward, info) -> correct.
    """

    instructions: str | None = None
    place: str = "system"
    invalid_penalty: float = 0.0
    invalid_message: str = INVALID_MESSAGE
    max_steps: int | None = None
    success: Callable[[bool, float, dict[str, Any]], bool] = default_success
    steps: int = 0
    invalid_moves: int = 0
    episode_return: float = 0.0
    observation: str = ""
    done: bool = False
    last_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.place not in INSTRUCTION_PLACES:
            raise ValueError(f"instructions go to one of {INSTRUCTION_PLACES}, got {self.place!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")

    def start(self, observation: str) -> list[dict[str, Any]]:
        """The prompt: the instructions and the first observation."""
        self.observation = observation
        if self.instructions is None:
            return [{"role": "user", "content": observation}]
        if self.place == "system":
            return [
                {"role": "system", "content": self.instructions},
                {"role": "user", "content": observation},
            ]
        return [{"role": "user", "content": f"{self.instructions}\n\n{observation}"}]

    def check_live(self) -> None:
        if self.done:
            raise RuntimeError("step after the episode ended")  # the agent loop's bug, not the model's

    def invalid(self, reason: str) -> StepResult:
        """An answer the parser rejected: the env is not stepped, the observation is repeated."""
        self.steps += 1
        self.invalid_moves += 1
        self.episode_return += self.invalid_penalty
        signals = {
            "invalid": True,
            "invalid_reason": reason,
            "invalid_moves": self.invalid_moves,
            "steps": self.steps,
        }
        if self._limit_reached():
            return self._end(self.invalid_penalty, signals, terminated=False, truncated=False, info={})
        message = f"{self.invalid_message}\n\n{self.observation}"
        return StepResult(
            messages=[{"role": "user", "content": message}], reward=self.invalid_penalty, signals=signals
        )

    def moved(
        self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> StepResult:
        """The env took the action: its reward is this step's, its end is the episode's."""
        self.steps += 1
        self.episode_return += reward
        self.observation, self.last_info = observation, info
        signals = {
            **scalar_signals(info),
            "invalid": False,
            "invalid_moves": self.invalid_moves,
            "steps": self.steps,
            "terminated": terminated,
            "truncated": truncated,
        }
        if terminated or truncated or self._limit_reached():
            return self._end(reward, signals, terminated=terminated, truncated=truncated, info=info)
        return StepResult(messages=[{"role": "user", "content": observation}], reward=reward, signals=signals)

    def _limit_reached(self) -> bool:
        return self.max_steps is not None and self.steps >= self.max_steps

    def _end(
        self,
        reward: float,
        signals: dict[str, Any],
        *,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> StepResult:
        self.done = True
        correct = bool(self.success(terminated, reward, info))
        ending = "terminated" if terminated else "truncated" if truncated else "step_limit"
        details = {
            "reason": "correct" if correct else ending,
            "ending": ending,
            "return": self.episode_return,
            "steps": self.steps,
            "invalid_moves": self.invalid_moves,
        }
        score = Score(self.episode_return, correct, self.invalid_moves == 0, details)
        return StepResult(done=True, reward=reward, signals=signals, score=score)
