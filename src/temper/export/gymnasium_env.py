"""Any temper task as a `gymnasium.Env` with text observations and actions (`pip install 'temper[envs]'`).

    env = TaskGymEnv("code_repair", split="test", options={"test_tasks": 10})   # or a Task object
    observation, info = env.reset(seed=0, options={"problem_index": 3})      # or {"problem_id": "test3"}
    observation, reward, terminated, truncated, info = env.step("run_tests")
    env.close()                                                               # the sandbox is removed

    env = gymnasium.make("temper.export.gymnasium_env:temper/TaskEnv-v0", task="treasure_hunt")

What an episode is, how messages become the observation text, the reward (process and outcome
weights: do not count an env's return twice), `terminated` / `truncated` and `info`: see
`temper.export.episode`. Here only the gymnasium side:

- spaces: `gymnasium.spaces.Text` for both, `min_length` 0 (the last observation of an episode is
  empty: the env said done), `max_length` `max_observation_chars` (default 16384: a generous single
  observation, ~4k tokens; code_repair's longest is ~400 characters) and `max_action_chars` (default
  4096: one turn of ~1k tokens, a command or an edit), charset `CHARSET` (printable ASCII with its
  whitespace: what temper's environments write, code, grids and test output; a Text space over all
  of Unicode would be a million-character set that sampling, `repr` and flattening all walk, and its
  `sample()` would stop meaning a plausible action). `charset=` widens it;
- an observation is made to fit: a character outside the charset becomes its Python escape
  (`\\xe9`, `\\u2019`), never silently dropped, and text over `max_observation_chars` keeps its head
  and ends with `[... N characters cut]` (`info["observation_cut"]` = N);
- an action outside the action space (not a str, too long, a character outside the charset) is the
  caller's error, as an out-of-range action is for any gymnasium env: ValueError / TypeError, the
  temper env is not stepped. Text the temper env does not understand is not that: it is the env's
  own invalid action (code_repair's "unknown command", treasure_hunt's penalty), passed through;
- `reset(seed=)` seeds `np_random`, which draws the problem when the options name none, so
  `reset(seed=s)` always plays the same problem and the resets after it the same sequence;
- `close()` closes the live temper env (idempotent; a new `reset` also closes the last one).

`import temper.export.gymnasium_env` registers `temper/TaskEnv-v0` (kwargs: this class's arguments;
`task` a catalog name with `options`, or a task object), so `gymnasium.make` builds it by id.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium.spaces import Text

from temper.export.episode import TaskEpisodes, Turn, resolve
from temper.tasks.base import Task

CHARSET = string.printable
"""Printable ASCII: digits, letters, punctuation, space, tab and newlines (module docstring)."""
ESCAPES = set("\\xuU0123456789abcdef")
"""What Python's escapes of other characters are written with: a charset must hold them."""
ENV_ID = "temper/TaskEnv-v0"


def _escaped(text: str, charset: frozenset[str]) -> str:
    if all(c in charset for c in text):
        return text
    return "".join(c if c in charset else c.encode("unicode_escape").decode("ascii") for c in text)


def fit(text: str, space: Text) -> tuple[str, int]:
    """`text` inside `space` (module docstring) and how many characters were cut."""
    text = _escaped(text, space.character_set)
    if len(text) <= space.max_length:
        return text, 0
    cut = len(text) - space.max_length
    while True:  # the marker's own length changes how much goes
        marker = f"\n[... {cut} characters cut]"
        keep = space.max_length - len(marker)
        if keep < 0:
            return text[: space.max_length], len(text) - space.max_length
        if len(text) - keep == cut:
            return text[:keep] + marker, cut
        cut = len(text) - keep


class TaskGymEnv(gym.Env[str, str]):
    """A temper task's episodes as a gymnasium env (module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        task: Task | str,
        split: str = "train",
        seed: int = 0,
        *,
        options: Mapping[str, Any] | None = None,
        n_problems: int = 100,
        max_turns: int | None = None,
        process: float = 1.0,
        outcome: float = 1.0,
        max_observation_chars: int = 16384,
        max_action_chars: int = 4096,
        charset: str = CHARSET,
        timeout_s: float | None = None,
    ):
        """task: a Task, or a catalog name built with `options`; split, seed: the problem pool
        (`task.sample(split, n_problems, seed)`); max_turns: actions before `truncated` (default
        the task's); process, outcome: the reward's weights; timeout_s: each env call's limit."""
        if missing := sorted(ESCAPES - set(charset)):
            raise ValueError(
                f"charset must hold {''.join(missing)!r}: characters outside it are escaped with them"
            )
        self.episode = TaskEpisodes(
            resolve(task, options),
            split,
            seed,
            n_problems=n_problems,
            max_turns=max_turns,
            process=process,
            outcome=outcome,
            timeout_s=timeout_s,
        )
        self.observation_space = Text(max_observation_chars, min_length=0, charset=charset)
        self.action_space = Text(max_action_chars, min_length=0, charset=charset)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = self.episode.select(options or {}, lambda n: int(self.np_random.integers(n)))
        return self._out(self.episode.start(index))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._check(action)
        turn = self.episode.step(action)
        observation, info = self._out(turn)
        return observation, turn.reward, turn.terminated, turn.truncated, info

    def close(self) -> None:
        self.episode.close()

    def _out(self, turn: Turn) -> tuple[str, dict[str, Any]]:
        observation, cut = fit(turn.observation, self.observation_space)
        return observation, turn.info | ({"observation_cut": cut} if cut else {})

    def _check(self, action: Any) -> None:
        if not isinstance(action, str):
            raise TypeError(f"an action is the policy's text (a str), got {type(action).__name__}")
        space = self.action_space
        if len(action) > space.max_length:
            raise ValueError(
                f"the action has {len(action)} characters; the action space's max_length is {space.max_length}"
            )
        if outside := sorted({c for c in action if c not in space.character_set}):
            raise ValueError(
                f"the action has characters outside the action space's charset: {''.join(outside)!r}"
            )


def register() -> None:
    """Register `temper/TaskEnv-v0` with gymnasium (once)."""
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point="temper.export.gymnasium_env:TaskGymEnv")


register()
