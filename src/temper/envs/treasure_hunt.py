"""treasure_hunt: a seeded grid world with walls, traps and one treasure, played through text.

The agent starts on `S` and must reach the treasure `$` by moving up, down, left or right.
Walls `#` (and the grid's edge) block a move: the agent stays where it is. A trap `^` ends the
episode with a penalty; the treasure ends it with a reward; the step limit ends it with neither.

Decisions (and why):
- A trap ENDS the episode (as FrozenLake's holes do): stepping on one is an unambiguous failure, the
  tabular problem stays the standard episodic one, and an LLM agent cannot farm progress signals
  by walking through traps.
- An unparseable answer is an invalid move: the agent stays, the step counts towards the limit
  (so an agent that never answers still ends), and it is counted (`invalid_moves`) and flagged in
  the step's signals. An answer naming two different moves is invalid too (ambiguous), so listing
  every direction never pays.
- The observation shows the local view (a square window, the edge drawn as wall), the agent's
  position and, by default, the treasure's position. Without the latter an agent on an unseen
  map can only explore; with it a policy that generalizes across maps exists (walk towards the
  treasure, around what the view shows), which is what the LLM half of the comparison asks of
  the model. `show_treasure=False` gives the harder, exploration version.
- Generated maps always have a path from start to treasure that avoids walls and traps (checked
  by BFS at generation), so every map is winnable and the BFS path is a demonstration.

Per-step signals (the `info` of `step`), for a later process reward: the move taken (or None),
`invalid` and its reason, `bumped` (into a wall or the edge), `trap`, `treasure`, `truncated`
(the step limit), the BFS distance to the treasure before and after the step (walls and traps
impassable; None on a trap) and `closer` / `farther`.

Text formats (rows and columns count from 0, row 0 at the top):
    map           S..#        observation at the start (view 3)
                  .#^.        position: row 0, col 0
                  ...$        treasure: row 2, col 3
                  ^...        view:
                              ###
                              #@.
                              #.#
    answer        any short text naming one move: "left", "I go down.", "Move: up"
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass

WALL, TRAP, TREASURE, FLOOR, START, AGENT = "#", "^", "$", ".", "S", "@"
MOVES = ("up", "down", "left", "right")
"""Action index -> move word; the gymnasium env's Discrete(4) uses the same order."""
DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_SYNONYMS = {"up": 0, "north": 0, "down": 1, "south": 1, "left": 2, "west": 2, "right": 3, "east": 3}
_MOVE_WORD = re.compile(r"\b(" + "|".join(_SYNONYMS) + r")\b")
_LETTERS = {"u": 0, "d": 1, "l": 2, "r": 3}
MAX_ANSWER_CHARS = 200
"""Longer answers are invalid: the protocol asks for a move, not an essay that names several."""

INSTRUCTIONS = (
    "Find the treasure on a grid. Legend: @ you, # wall, ^ trap (ends the game), $ treasure, "
    ". floor. Rows and columns count from 0, row 0 at the top. Answer with one move: up, down, "
    "left or right."
)
"""What an agent must be told once; the observations below assume it."""


@dataclass(frozen=True)
class GridMap:
    """One map: `rows` of WALL/TRAP/TREASURE/FLOOR characters and the start cell (a floor cell)."""

    rows: tuple[str, ...]
    start: tuple[int, int]

    @property
    def height(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return len(self.rows[0])

    @property
    def treasure(self) -> tuple[int, int]:
        for r, row in enumerate(self.rows):
            c = row.find(TREASURE)
            if c >= 0:
                return r, c
        raise AssertionError("GridMap without a treasure")  # parse() and generate_map() forbid it

    @classmethod
    def parse(cls, text: str) -> GridMap:
        """A map drawn as text, one row a line, `S` marking the start (a floor cell):

        S.#
        .^$
        """
        lines = [line.strip() for line in text.strip().splitlines()]
        if not lines or len({len(line) for line in lines}) != 1:
            raise ValueError("a map needs rows of equal, non-zero length")
        allowed = {WALL, TRAP, TREASURE, FLOOR, START}
        bad = {ch for line in lines for ch in line} - allowed
        if bad:
            raise ValueError(f"unknown map characters {sorted(bad)}; allowed: {sorted(allowed)}")
        text_all = "".join(lines)
        if text_all.count(START) != 1 or text_all.count(TREASURE) != 1:
            raise ValueError("a map needs exactly one start S and one treasure $")
        r = next(i for i, line in enumerate(lines) if START in line)
        start = (r, lines[r].index(START))
        return cls(tuple(line.replace(START, FLOOR) for line in lines), start)

    def draw(self, agent: tuple[int, int] | None = None) -> str:
        """The whole map as text, with `@` on the agent (default: `S` on the start)."""
        rows = [list(row) for row in self.rows]
        if agent is None:
            rows[self.start[0]][self.start[1]] = START
        else:
            rows[agent[0]][agent[1]] = AGENT
        return "\n".join("".join(row) for row in rows)

    def cell(self, r: int, c: int) -> str:
        """The character at (r, c); outside the grid is wall."""
        if 0 <= r < self.height and 0 <= c < self.width:
            return self.rows[r][c]
        return WALL


def distances_to_treasure(grid: GridMap) -> list[list[int | None]]:
    """BFS distance (in moves) from every cell to the treasure through floor cells; walls, traps
    and cells cut off from the treasure are None."""
    dist: list[list[int | None]] = [[None] * grid.width for _ in range(grid.height)]
    tr, tc = grid.treasure
    dist[tr][tc] = 0
    queue = deque([(tr, tc)])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DELTAS:
            nr, nc = r + dr, c + dc
            if grid.cell(nr, nc) in (FLOOR,) and dist[nr][nc] is None:
                dist[nr][nc] = dist[r][c] + 1
                queue.append((nr, nc))
    return dist


def shortest_path(grid: GridMap) -> list[str] | None:
    """The moves of a shortest safe path from start to treasure (None if there is none).

    Follows the BFS distances downhill, trying moves in MOVES order, so the path is deterministic."""
    dist = distances_to_treasure(grid)
    r, c = grid.start
    if dist[r][c] is None:
        return None
    path = []
    while dist[r][c] != 0:
        for move, (dr, dc) in zip(MOVES, DELTAS):
            nr, nc = r + dr, c + dc
            if 0 <= nr < grid.height and 0 <= nc < grid.width and dist[nr][nc] == dist[r][c] - 1:
                path.append(move)
                r, c = nr, nc
                break
    return path


def generate_map(
    size: int,
    seed: int,
    *,
    wall_density: float = 0.2,
    trap_density: float = 0.1,
    min_distance: int | None = None,
    max_tries: int = 1000,
) -> GridMap:
    """A random size x size map, a pure function of its arguments, with a safe path start -> treasure.

    Start and treasure are distinct floor cells at least `min_distance` apart (Manhattan; default
    size - 1, so the treasure is never next to the start); every other cell is a wall with
    probability `wall_density`, else a trap with probability `trap_density`, else floor. Draws are
    repeated (from the same generator) until BFS finds a path avoiding walls and traps."""
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    min_distance = size - 1 if min_distance is None else min_distance
    rng = random.Random(seed)  # stable across Python versions for these calls, unlike hash()
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(max_tries):
        start, treasure = rng.sample(cells, 2)
        if abs(start[0] - treasure[0]) + abs(start[1] - treasure[1]) < min_distance:
            continue
        rows = []
        for r in range(size):
            row = []
            for c in range(size):
                if (r, c) == treasure:
                    row.append(TREASURE)
                elif (r, c) == start:
                    row.append(FLOOR)
                else:
                    x = rng.random()
                    row.append(
                        WALL if x < wall_density else TRAP if x < wall_density + trap_density else FLOOR
                    )
            rows.append("".join(row))
        grid = GridMap(tuple(rows), start)
        if distances_to_treasure(grid)[start[0]][start[1]] is not None:
            return grid
    raise ValueError(f"no solvable {size}x{size} map in {max_tries} draws; lower the densities")


def parse_move(text: str) -> tuple[int | None, str]:
    """(action index, reason) for an answer: the one move word it names ("ok") or None with why.

    A move word (up/down/left/right or north/south/west/east, whole words, any case) anywhere in a
    short answer counts; so does an answer that is just one letter U/D/L/R. Reasons for None:
    "empty", "too_long" (over MAX_ANSWER_CHARS), "no_move", "ambiguous" (two different moves)."""
    stripped = text.strip().lower()
    if not stripped:
        return None, "empty"
    if len(stripped) > MAX_ANSWER_CHARS:
        return None, "too_long"
    if stripped.rstrip(".!") in _LETTERS:
        return _LETTERS[stripped.rstrip(".!")], "ok"
    found = {_SYNONYMS[m] for m in _MOVE_WORD.findall(stripped)}
    if not found:
        return None, "no_move"
    if len(found) > 1:
        return None, "ambiguous"
    return found.pop(), "ok"


@dataclass(frozen=True)
class Rewards:
    treasure: float = 1.0
    """On reaching the treasure (the episode ends)."""
    trap: float = -1.0
    """On stepping on a trap (the episode ends)."""
    step: float = 0.0
    """Added on every other step (a negative value is a time cost)."""
    invalid: float = 0.0
    """Added on an unparseable or ambiguous answer."""


class TreasureHunt:
    """The environment: `reset(seed) -> observation`, `step(answer) -> (observation, reward, done, info)`.

    With `grid` given, every episode plays that map (`seed` is ignored); otherwise each reset
    generates a `size` x `size` map from its seed (`map_options` go to generate_map). `view` is the
    side of the square window around the agent (odd). `max_steps` defaults to height x width."""

    def __init__(
        self,
        grid: GridMap | None = None,
        *,
        size: int = 6,
        view: int = 3,
        max_steps: int | None = None,
        show_treasure: bool = True,
        rewards: Rewards | None = None,
        map_options: dict | None = None,
    ):
        if view < 1 or view % 2 == 0:
            raise ValueError(f"view must be an odd number >= 1, got {view}")
        self.fixed_grid, self.size, self.view = grid, size, view
        self._max_steps, self.show_treasure = max_steps, show_treasure
        self.rewards = rewards or Rewards()
        self.map_options = dict(map_options or {})
        self.grid: GridMap | None = None

    def reset(self, seed: int | None = None) -> str:
        if self.fixed_grid is not None:
            self.grid = self.fixed_grid
        else:
            if seed is None:
                raise ValueError("a generated map needs a seed (or give the env a fixed grid)")
            self.grid = generate_map(self.size, seed, **self.map_options)
        self.max_steps = self._max_steps or self.grid.height * self.grid.width
        self.distance = distances_to_treasure(self.grid)
        self.position = self.grid.start
        self.steps = self.invalid_moves = 0
        self.done = False
        return self.observation()

    def observation(self) -> str:
        r, c = self.position
        k = self.view // 2
        window = []
        for dr in range(-k, k + 1):
            row = []
            for dc in range(-k, k + 1):
                row.append(AGENT if dr == dc == 0 else self.grid.cell(r + dr, c + dc))
            window.append("".join(row))
        lines = [f"position: row {r}, col {c}"]
        if self.show_treasure:
            tr, tc = self.grid.treasure
            lines.append(f"treasure: row {tr}, col {tc}")
        return "\n".join([*lines, "view:", *window])

    def step(self, answer: str) -> tuple[str, float, bool, dict]:
        action, reason = parse_move(answer)
        reward, done, info = self.move(action)
        info["invalid_reason"] = None if action is not None else reason
        return self.observation(), reward, done, info

    def move(self, action: int | None) -> tuple[float, bool, dict]:
        """One step by action index (None: an invalid answer). The gymnasium env calls this."""
        if self.grid is None or self.done:
            raise RuntimeError("step after the episode ended (or before reset)")
        r, c = self.position
        before = self.distance[r][c]
        self.steps += 1
        reward, bumped, trap, treasure = self.rewards.step, False, False, False
        if action is None:
            self.invalid_moves += 1
            reward += self.rewards.invalid
        else:
            dr, dc = DELTAS[action]
            target = self.grid.cell(r + dr, c + dc)
            if target == WALL:
                bumped = True
            else:
                self.position = (r + dr, c + dc)
                trap, treasure = target == TRAP, target == TREASURE
                if trap:
                    reward = self.rewards.trap
                elif treasure:
                    reward = self.rewards.treasure
        after = self.distance[self.position[0]][self.position[1]]
        truncated = not (trap or treasure) and self.steps >= self.max_steps
        self.done = trap or treasure or truncated
        info = {
            "move": None if action is None else MOVES[action],
            "invalid": action is None,
            "bumped": bumped,
            "trap": trap,
            "treasure": treasure,
            "truncated": truncated,
            "distance_before": before,
            "distance": after,
            "closer": after is not None and before is not None and after < before,
            "farther": after is not None and before is not None and after > before,
            "position": self.position,
            "steps": self.steps,
            "invalid_moves": self.invalid_moves,
        }
        return reward, self.done, info


def demonstration(env: TreasureHunt, seed: int | None = None) -> list[tuple[str, str]]:
    """(observation, move) pairs of the BFS shortest path played in `env` from reset(seed): SFT data.

    The last move reaches the treasure (asserted), so a demonstration is checked by the env itself."""
    observation = env.reset(seed)
    path = shortest_path(env.grid)
    if path is None:
        raise ValueError("the map has no safe path from start to treasure")
    pairs, done, info = [], False, {}
    for move in path:
        pairs.append((observation, move))
        observation, _, done, info = env.step(move)
    if path and not (done and info["treasure"]):
        raise AssertionError("the BFS path did not reach the treasure")  # a bug in this module
    return pairs
