"""treasure_hunt as an environment task: the LLM agent plays a map, one move per chat turn.

    user        Find $. ... (instructions)                    (the problem's prompt)
                d2 r1                                         the treasure: 2 rows down, 1 column right
                #.#                                           the 3x3 view, @ the agent
                .@^
                ...
    assistant   down
    user        d1 r1 / view ...                              (the environment's turn, never trained on)
    assistant   right
    ...                                                       until the treasure, a trap or the step limit

Problems are maps (`temper.envs.treasure_hunt.generate_map`), each a pure function of its seed:
- train: the first `train_maps` seeds from `train_seed` (the "seen" maps: SFT and RL draw from
  them, with repeats, so a run of a few thousand problems sees all of them);
- test: `test_maps` seeds from `test_seed`, a disjoint range: unseen maps of the same size;
- ood: unseen maps of side `ood_size` (default size + 2: longer paths, positions and offsets the
  policy never saw, and longer episodes), with their own seed range and step limit.
Maps whose shortest path is longer than the split's step limit are skipped (unwinnable).

The observation (why this one): the tiny default reads one byte per token and has 512 positions,
and a whole episode (prompt, K moves, K observations) must fit, so each observation is short: the
treasure's offset (`d2 r1`: 2 rows down, 1 column right; a zero offset is left out) and the local
view. The offset rather than absolute positions because it makes the policy that generalizes to
unseen maps (walk towards the treasure, around what the view shows) a lookup instead of a
subtraction the 1M-parameter model would first have to learn; `relative: false` shows the core
env's own observation (absolute position, treasure position, view) for larger models. With the
defaults (size 4, view 3, a limit of 2 x size + 2 = 10 moves) the prompt is ~105 tokens and each
move + observation ~25, so a shortest-path episode is ~180 tokens and one that runs to the limit
~355; ood (size 6, 14 moves) at most ~460. Without the instructions (`instructions: false`) the
prompt is ~15 tokens. An RL stage needs `max_turns` >= the step limit and an episode token budget
(`max_episode_tokens`) that holds a whole episode, or episodes end early at the loop's limits
(stop reasons max_turns / max_tokens, graded wrong); eval takes max_turns from `max_turns` here.

Rewards: the outcome (`score`) is 1 on the treasure, else 0 (a trap or the step limit); `correct`
is the treasure and `parsed` is "no invalid move". The per-step process reward is `+progress` for
a step that brings the agent closer to the treasure (BFS distance), `-progress` for one that takes
it farther, 0 otherwise (a bump, an invalid answer, a sideways step), weighted by the recipe's
`process` reward component. Signals per step: closer, farther, bumped, invalid, trap, treasure
(0/1) and, on the winning step, `won_steps` (the episode's length), so an eval's episode summary
gives the mean steps of won episodes as signals.won_steps / signals.treasure.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.envs.base import StepResult
from temper.envs.treasure_hunt import GridMap, TreasureHunt, generate_map, shortest_path
from temper.tasks.base import Problem, Score, check_split, draw

INSTRUCTIONS = "Find $. d2 r1: $ is 2 down, 1 right. @ you, # wall, ^ trap. Say up, down, left or right."


@dataclass(frozen=True)
class TreasureConfig:
    size: int = 4
    """Side of the train and test maps."""
    ood_size: int = 0
    """Side of the ood maps (0: size + 2)."""
    view: int = 3
    """Side of the square view around the agent (odd)."""
    max_steps: int = 0
    """Moves per episode on train/test maps (0: 2 x size + 2)."""
    ood_max_steps: int = 0
    """Moves per episode on ood maps (0: 2 x ood_size + 2)."""
    wall_density: float = 0.2
    trap_density: float = 0.1
    show_treasure: bool = True
    """Show where the treasure is (without it an agent on an unseen map can only explore)."""
    relative: bool = True
    """Compact observation (treasure offset + view); False: the core env's absolute one."""
    instructions: bool = True
    """Open the prompt with INSTRUCTIONS. A model that learns the protocol from demonstrations
    alone (the tiny default, trained from scratch) reads them as a constant prefix, and they are
    half of a shortest-path episode's tokens: its recipe turns them off to halve the compute."""
    progress: float = 0.1
    """Process reward: +progress for a step closer to the treasure, -progress for one farther."""
    train_seed: int = 0
    train_maps: int = 500
    """The seen maps: seeds train_seed .. train_seed + train_maps - 1."""
    test_seed: int = 1_000_000
    test_maps: int = 1000
    ood_seed: int = 2_000_000
    ood_maps: int = 1000

    def __post_init__(self) -> None:
        if self.size < 2 or self.view < 1 or self.view % 2 == 0:
            raise ValueError(f"need size >= 2 and an odd view >= 1, got size {self.size}, view {self.view}")
        if min(self.train_maps, self.test_maps, self.ood_maps) < 1 or self.progress < 0:
            raise ValueError("need at least one map per split and progress >= 0")
        ranges = {
            "train": (self.train_seed, self.train_seed + self.train_maps),
            "test": (self.test_seed, self.test_seed + self.test_maps),
            "ood": (self.ood_seed, self.ood_seed + self.ood_maps),
        }
        for a, (lo_a, hi_a) in ranges.items():
            for b, (lo_b, hi_b) in ranges.items():
                if a < b and lo_a < hi_b and lo_b < hi_a:
                    raise ValueError(f"the {a} and {b} map seed ranges overlap: {ranges[a]} and {ranges[b]}")

    def split_size(self, split: str) -> int:
        return (self.ood_size or self.size + 2) if split == "ood" else self.size

    def split_max_steps(self, split: str) -> int:
        if split == "ood":
            return self.ood_max_steps or 2 * self.split_size("ood") + 2
        return self.max_steps or 2 * self.size + 2


@dataclass(frozen=True)
class TreasureHuntTask:
    """Maps played as multi-turn episodes, one move per turn (module docstring)."""

    config: TreasureConfig = field(default_factory=TreasureConfig)
    name: ClassVar[str] = "treasure_hunt"
    config_type: ClassVar[type] = TreasureConfig

    @property
    def max_turns(self) -> int:
        """The longest episode of any split (each env ends at its own split's limit)."""
        return max(self.config.split_max_steps(s) for s in ("train", "ood"))

    def map_seeds(self, split: str) -> list[int]:
        """The split's map seeds, those whose map is winnable within its step limit."""
        check_split(split)
        return _winnable(self.config, split)

    def problem(self, split: str, seed: int) -> Problem:
        """The split's map of `seed`."""
        c = self.config
        grid = generate_map(
            c.split_size(split), seed, wall_density=c.wall_density, trap_density=c.trap_density
        )
        return self.problem_of(grid, split, f"map{seed}", {"seed": seed})

    def problem_of(self, grid: GridMap, split: str, id: str, extra: dict | None = None) -> Problem:
        """The problem of playing `grid` (a generated map, or one drawn with GridMap.parse) under
        the split's step limit; `data` holds what the env needs (rows, start, limit, BFS path)."""
        path = shortest_path(grid)
        if path is None:
            raise ValueError(f"map {id} has no safe path from start to treasure")
        data = {
            **(extra or {}),
            "rows": list(grid.rows),
            "start": list(grid.start),
            "max_steps": self.config.split_max_steps(split),
            "path": path,
        }
        prompt = TreasureHuntEnv(self.config, data).reset()[0]["content"]
        return Problem(self.name, split, id, prompt, data)

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` maps of `split`: drawn with repeats from the seen maps for train (RL and SFT always
        get n), without repeats from the held-out ones (at most all of them)."""
        seeds = draw(self.map_seeds(split), f"treasure_hunt:{split}:{seed}", n, repeat=split == "train")
        return [self.problem(split, s) for s in seeds]

    def problem_key(self, problem: Problem) -> str:
        """The map itself (its rows and start), what identifies a problem: the prompt is the first
        local view, which many maps share, so the contamination check compares keys instead."""
        return "/".join(problem.data["rows"]) + f"@{problem.data['start'][0]},{problem.data['start'][1]}"

    def make_env(self, problem: Problem) -> TreasureHuntEnv:
        return TreasureHuntEnv(self.config, problem.data)

    def demonstration_messages(self, problem: Problem) -> list[dict[str, Any]]:
        """The whole BFS shortest-path episode as a conversation: the prompt, then one assistant
        move and the environment's observation in turn, ending with the move onto the treasure.
        SFT trains the assistant turns only (the observations are the environment's)."""
        env = self.make_env(problem)
        messages = env.reset()
        result = StepResult()
        for move in problem.data["path"]:
            messages.append({"role": "assistant", "content": move})
            result = env.step(move)
            messages += result.messages
        if not (result.done and result.score is not None and result.score.correct):
            raise AssertionError(f"the BFS path of {problem.id} did not win")  # a bug, not data
        return messages

    def demonstration(self, problem: Problem) -> str:
        """The shortest path, one move per line (what `score` plays)."""
        return "\n".join(problem.data["path"])

    def score(self, problem: Problem, completion: str) -> Score:
        """A whole plan at once: each non-empty line of the completion is one move, played from
        the start until the episode ends (an unfinished plan ends at the step limit's grade: wrong)."""
        env = self.make_env(problem)
        env.reset()
        moves = [line for line in completion.splitlines() if line.strip()]
        for move in moves:
            result = env.step(move)
            if result.done:
                return result.score
        return env.grade("no_more_moves")

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt}\n{' '.join(problem.data['path'])}"


@functools.cache
def _winnable(config: TreasureConfig, split: str) -> list[int]:
    start, count = {
        "train": (config.train_seed, config.train_maps),
        "test": (config.test_seed, config.test_maps),
        "ood": (config.ood_seed, config.ood_maps),
    }[split]
    size, limit = config.split_size(split), config.split_max_steps(split)
    out = []
    for s in range(start, start + count):
        grid = generate_map(size, s, wall_density=config.wall_density, trap_density=config.trap_density)
        if len(shortest_path(grid)) <= limit:
            out.append(s)
    return out


def offset_text(agent: tuple[int, int], treasure: tuple[int, int]) -> str:
    """`d2 r1`: the treasure is 2 rows down and 1 column right of the agent (zero offsets left out)."""
    dr, dc = treasure[0] - agent[0], treasure[1] - agent[1]
    parts = []
    if dr:
        parts.append(f"{'d' if dr > 0 else 'u'}{abs(dr)}")
    if dc:
        parts.append(f"{'r' if dc > 0 else 'l'}{abs(dc)}")
    return " ".join(parts)


class TreasureHuntEnv:
    """One episode on one map (`data`: rows, start, max_steps), one move per policy turn."""

    stop = ()

    def __init__(self, config: TreasureConfig, data: dict[str, Any]):
        self.config = config
        grid = GridMap(tuple(data["rows"]), tuple(data["start"]))
        self.core = TreasureHunt(
            grid, view=config.view, max_steps=data["max_steps"], show_treasure=config.show_treasure
        )
        self.won_steps = 0

    def observation(self) -> str:
        if not self.config.relative:
            return self.core.observation()
        core = self.core
        r, c = core.position
        k = core.view // 2
        view = [
            "".join("@" if dr == dc == 0 else core.grid.cell(r + dr, c + dc) for dc in range(-k, k + 1))
            for dr in range(-k, k + 1)
        ]
        head = [offset_text(core.position, core.grid.treasure)] if self.config.show_treasure else []
        return "\n".join(head + view)

    def reset(self) -> list[dict[str, Any]]:
        self.core.reset()
        head = f"{INSTRUCTIONS}\n" if self.config.instructions else ""
        return [{"role": "user", "content": head + self.observation()}]

    def step(self, action: str) -> StepResult:
        _, _, done, info = self.core.step(action)
        signals = {k: int(info[k]) for k in ("closer", "farther", "bumped", "invalid", "trap", "treasure")}
        reward = self.config.progress * (signals["closer"] - signals["farther"])
        if not done:
            return StepResult(
                messages=[{"role": "user", "content": self.observation()}], reward=reward, signals=signals
            )
        reason = "treasure" if info["treasure"] else "trap" if info["trap"] else "step_limit"
        if info["treasure"]:
            signals["won_steps"] = info["steps"]
        return StepResult(done=True, reward=reward, signals=signals, score=self.grade(reason))

    def grade(self, reason: str) -> Score:
        won = reason == "treasure"
        details = {"reason": reason, "steps": self.core.steps, "invalid_moves": self.core.invalid_moves}
        return Score(float(won), won, self.core.invalid_moves == 0, details)
