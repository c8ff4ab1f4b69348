"""A `gymnasium.Env` played through text: any gymnasium environment as a temper `Env`, unchanged.

    env = GymTextEnv(
        GymTreasureHunt(grid),
        render_observation=lambda obs, info: info["text"],   # what the policy reads
        parse_action=lambda text: parse_move(text)[0],        # its answer -> an action, None if invalid
        instructions=INSTRUCTIONS,
        seed=0,
    )
    messages = env.reset()          # [system: instructions, user: first observation]
    result = env.step("right")      # StepResult(messages=[user: next observation], reward=r, ...)

Mapping (gymnasium 1.x API: `reset(seed=, options=) -> (obs, info)`,
`step(a) -> (obs, reward, terminated, truncated, info)`):
- each observation is a `user` turn, `render_observation(observation, info)`;
- an answer `parse_action` rejects (None), or an action outside `action_space`, is invalid: the env
  is NOT stepped (gymnasium has no invalid action), the step counts, `invalid_penalty` (default 0)
  is its reward, and the last observation is shown again (treasure_hunt's convention);
- the env's reward is the step's `StepResult.reward`; `terminated or truncated` (or `max_steps`
  actions, invalid ones included) ends the episode;
- the final `Score`: reward = the episode's return (rewards plus penalties), correct =
  `success(terminated, last_reward, info)` (default: terminated on a positive reward), parsed =
  no invalid answer in the episode. Details: ending (terminated / truncated / step_limit),
  return, steps, invalid_moves.

The return is in both the per-step rewards and the outcome, so weight one of the `process` and
`outcome` reward components in a recipe (or give the env a shaping reward as process and its goal
as outcome), not both, or the env's reward counts twice. Scalar entries of `info` are logged as the
step's signals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from temper.envs.adapters._episode import INVALID_MESSAGE, TextEpisode, default_success
from temper.envs.base import StepResult


def _str_observation(observation: Any, info: dict[str, Any]) -> str:
    return str(observation)


class GymTextEnv:
    """A gymnasium env as a temper `Env`; one episode per instance (`reset` once, then `step`)."""

    stop: Sequence[str] = ()

    def __init__(
        self,
        env: gym.Env,
        *,
        parse_action: Callable[[str], Any],
        render_observation: Callable[[Any, dict[str, Any]], str] = _str_observation,
        instructions: str | None = None,
        instructions_as: str = "system",
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        invalid_penalty: float = 0.0,
        invalid_message: str = INVALID_MESSAGE,
        max_steps: int | None = None,
        success: Callable[[bool, float, dict[str, Any]], bool] = default_success,
    ):
        self.env, self.parse_action, self.render = env, parse_action, render_observation
        self.seed, self.options = seed, options
        self.episode = TextEpisode(
            instructions, instructions_as, invalid_penalty, invalid_message, max_steps, success
        )

    def reset(self) -> list[dict[str, Any]]:
        observation, info = self.env.reset(seed=self.seed, options=self.options)
        return self.episode.start(self.render(observation, info))

    def step(self, action: str) -> StepResult:
        self.episode.check_live()
        parsed = self.parse_action(action)
        if parsed is None:
            return self.episode.invalid("unparsed")
        if not self.env.action_space.contains(parsed):
            return self.episode.invalid("out_of_space")
        observation, reward, terminated, truncated, info = self.env.step(parsed)
        text = self.render(observation, info)
        return self.episode.moved(text, float(reward), bool(terminated), bool(truncated), dict(info))
