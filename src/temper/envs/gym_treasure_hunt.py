"""treasure_hunt as a `gymnasium.Env`, the ecosystem's convention, for tabular and classic RL agents.

Actions Discrete(4) in `MOVES` order (up, down, left, right); the observation is the agent's cell
as one index, row * width + col, as FrozenLake's: enough for a tabular agent on ONE map, and
nothing that carries to another (which is the point of the Q-learning vs LLM comparison). The
text observation an LLM would read is `info["text"]`; `render()` (render_mode "ansi") draws the
whole map. `terminated` on treasure or trap, `truncated` at the step limit; `info` carries the
step signals of `TreasureHunt.move`.

The map: `grid` fixed for every episode, or `options={"grid": GridMap}` at reset for one episode,
or, with neither, a map generated from the env's seeded generator at each reset (sizes fixed, so
the observation space holds).
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces

from temper.envs.treasure_hunt import GridMap, Rewards, TreasureHunt


class GymTreasureHunt(gym.Env):
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        grid: GridMap | None = None,
        *,
        size: int = 6,
        view: int = 3,
        max_steps: int | None = None,
        rewards: Rewards | None = None,
        map_options: dict | None = None,
        render_mode: str | None = None,
    ):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        height, width = (grid.height, grid.width) if grid is not None else (size, size)
        self.core = TreasureHunt(
            grid, size=size, view=view, max_steps=max_steps, rewards=rewards, map_options=map_options
        )
        self.width = width
        self.observation_space = spaces.Discrete(height * width)
        self.action_space = spaces.Discrete(4)
        self.render_mode = render_mode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        core = self.core
        grid = (options or {}).get("grid")
        if grid is not None:
            if grid.height * grid.width != self.observation_space.n:
                raise ValueError(
                    f"a {grid.height}x{grid.width} map does not fit this env's {self.observation_space.n} states"
                )
            saved, core.fixed_grid = core.fixed_grid, grid
            text = core.reset()
            core.fixed_grid = saved
        elif core.fixed_grid is not None:
            text = core.reset()
        else:
            text = core.reset(int(self.np_random.integers(2**31)))
        return self._state(), {"text": text}

    def step(self, action):
        reward, _, info = self.core.move(int(action))
        info["text"] = self.core.observation()
        return self._state(), reward, info["treasure"] or info["trap"], info["truncated"], info

    def render(self):
        if self.render_mode == "ansi":
            return self.core.grid.draw(agent=self.core.position)
        return None

    def _state(self) -> int:
        r, c = self.core.position
        return r * self.width + c
