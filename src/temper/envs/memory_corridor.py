"""memory_corridor: something seen early is needed late, in an episode longer than its context budget.

    user        Corridor. Say look, walk or open N.          (the task: compaction always keeps it)
    assistant   look
    user        Key in box 3. 5 to go.                       (the fact, shown once, after the task)
    assistant   walk
    user        4 to go. Sign 7.                             (each step: distance and a distractor digit)
    ...
    user        At the door. Open 1-4.
    assistant   open 3                                       (right box: 1, else 0)

The corridor is longer than the task's context budget (`context_tokens`, a
`temper.rollout.context.ContextPolicy` the env exposes as `context_budget`, so RL and eval play it under
the same budget): partway down, the agent loop compacts the conversation. With `on_overflow:
truncate` the oldest turns, the key's among them, are dropped and the agent at the door can only
guess (1 in `boxes`); with `summarise` the policy is asked for a note, and the episode goes on
from the task, the note and the latest observation: the note must carry the key's box (and the
next note must carry it on). The env grades notes (`summary_reward`, the `summary` reward
component): 1 when a note names the key's box and no other box (a note listing every box is not
a kept fact), else 0; signals `summaries` and `summary_kept` count them per episode.

Problems are seeded: the key's box, the corridor's length and the signs. train/test: lengths
`min_length`..`max_length` from disjoint seed ranges; ood: longer corridors (`ood_length`), so
more compactions per episode (a note must survive being re-summarised).

SFT demonstrations (`demonstration_rows`): with `on_overflow: summarise` and a budget, the
episodes as the summarise harness splits them, a note every `demo_gap_min`..`demo_gap_max` walks, each row a
conversation of the shape the loop builds (`context.summary_request`, `context.summarised`). A
demonstration's note keeps the key (`Key in box 3.`) with probability `demo_keep`, else it does
not (`Walking on.`), and a demonstration at the door that no longer knows the key opens a box at
random: SFT starts the policy as a note-taker that keeps the fact only some of the time, the skill
RL then has to train. Without a budget (or with truncate) a demonstration is the whole episode,
one row (a recipe mixes both, so the policy also reads a whole corridor).
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.envs.base import StepResult, play_plan
from temper.rollout.context import ContextPolicy, summarised, summary_request
from temper.tasks.base import Problem, Score, check_split

PROMPT = "Corridor. Say look, walk or open N."
NOTE_REQUEST = "Note?"
"""The summary request of this task: short, since the tiny default reads one byte per token."""
BOX = re.compile(r"box (\d+)")


@dataclass(frozen=True)
class MemoryCorridorConfig:
    boxes: int = 4
    """Boxes at the door (a guess is right 1 in `boxes`)."""
    min_length: int = 5
    max_length: int = 6
    """Walks from the start to the door, train and test."""
    ood_length: int = 9
    """Walks on ood corridors."""
    context_tokens: int = 0
    """The context budget of a row in tokens (`ContextPolicy.max_tokens`; 0: none)."""
    on_overflow: str = "summarise"
    """truncate | summarise."""
    summary_max_tokens: int = 24
    demo_gap_min: int = 2
    demo_gap_max: int = 4
    """Walks between the notes of a demonstration, drawn uniformly in [min, max] per note: the
    loop asks for a note where the tokens run out, which moves with the notes' lengths, so the
    policy is shown requests at several points."""
    demo_keep: float = 0.3
    """Chance a demonstration's note keeps the key."""
    train_seed: int = 0
    test_seed: int = 1_000_000
    ood_seed: int = 2_000_000
    problems: int = 1000
    """Problems per held-out split (train draws from an unbounded seed range)."""

    def __post_init__(self) -> None:
        if self.boxes < 2 or not 1 <= self.min_length <= self.max_length or self.ood_length < 1:
            raise ValueError("need boxes >= 2 and 1 <= min_length <= max_length, ood_length >= 1")
        if not 0.0 <= self.demo_keep <= 1.0 or not 1 <= self.demo_gap_min <= self.demo_gap_max:
            raise ValueError(
                f"need demo_keep in [0, 1] and 1 <= demo_gap_min <= demo_gap_max, got {self.demo_keep}, "
                f"{self.demo_gap_min}, {self.demo_gap_max}"
            )
        self.policy()  # a bad on_overflow or budget fails when the recipe is validated

    def policy(self) -> ContextPolicy:
        return ContextPolicy(self.context_tokens, self.on_overflow, self.summary_max_tokens, NOTE_REQUEST)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MemoryCorridorTask:
    """Corridors played as multi-turn episodes under a context budget (module docstring)."""

    config: MemoryCorridorConfig = field(default_factory=MemoryCorridorConfig)
    name: ClassVar[str] = "memory_corridor"
    config_type: ClassVar[type] = MemoryCorridorConfig

    @property
    def max_turns(self) -> int:
        """The longest episode of any split: look, the walks, open, and two spare moves."""
        return max(self.config.max_length, self.config.ood_length) + 4

    @property
    def max_episode_tokens(self) -> int:
        """Eval's budget for a whole episode, every row's tokens after its prompt: an observation
        and an action are ~26 tokens, a summary request and note ~25 more (a generous bound)."""
        return 64 * self.max_turns

    def problem(self, split: str, seed: int) -> Problem:
        check_split(split)
        c = self.config
        rng = random.Random(f"memory_corridor:{split}:{seed}")
        length = c.ood_length if split == "ood" else rng.randint(c.min_length, c.max_length)
        data = {
            "key": rng.randint(1, c.boxes),
            "length": length,
            "signs": [rng.randint(0, 9) for _ in range(length)],
            "max_steps": length + 4,
        }
        return Problem(self.name, split, f"corridor{seed}", PROMPT, data)

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """train: n fresh seeds (repeats allowed, as RL needs n); test/ood: n of the split's
        `problems` seeds, without repeats."""
        check_split(split)
        c = self.config
        start = {"train": c.train_seed, "test": c.test_seed, "ood": c.ood_seed}[split]
        rng = random.Random(f"memory_corridor:{split}:draw:{seed}")
        if split == "train":
            seeds: list[int] = []
            tries = 0
            while len(seeds) < n:  # never a corridor the held-out splits hold (the contamination check)
                s = start + rng.randrange(1 << 20)
                if self.problem_key(self.problem("train", s)) not in _held_out_keys(self):
                    seeds.append(s)
                elif (tries := tries + 1) > 100 * (n + 10):
                    raise ValueError(
                        "memory_corridor: nearly every train corridor is held out (lower `problems`)"
                    )
        else:
            seeds = [start + s for s in rng.sample(range(c.problems), min(n, c.problems))]
        return [self.problem(split, s) for s in seeds]

    def problem_key(self, problem: Problem) -> str:
        """The corridor itself (the prompt is the same for every problem)."""
        d = problem.data
        return f"key{d['key']}/len{d['length']}/signs{''.join(map(str, d['signs']))}"

    def make_env(self, problem: Problem) -> MemoryCorridorEnv:
        return MemoryCorridorEnv(self.config, problem.data)

    def demonstration_rows(self, problem: Problem) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        """The expert's episode (module docstring): look, the walks, open; with the summarise
        harness a note every `demo_gap_min`..`demo_gap_max` walks. One (prompt, completion) per
        row: the first row's prompt is the task, a later row's the compacted conversation (the
        task, the note, the latest observation), never trained, as in the loop."""
        c, d = self.config, problem.data
        rng = random.Random(f"memory_corridor:demo:{problem.id}")
        env = self.make_env(problem)
        messages = env.reset()
        rows: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
        prompt = list(messages)
        known = True  # the key's box is in the context (its observation, or a note that kept it)
        notes = c.on_overflow == "summarise" and c.policy().on

        def act(action: str) -> StepResult:
            messages.append({"role": "assistant", "content": action})
            result = env.step(action)
            messages.extend(result.messages)
            return result

        act("look")
        due = rng.randint(c.demo_gap_min, c.demo_gap_max)
        for walked in range(1, d["length"] + 1):
            act("walk")
            if notes and walked == due and walked < d["length"]:
                due += rng.randint(c.demo_gap_min, c.demo_gap_max)
                known = known and rng.random() < c.demo_keep
                note = f"Key in box {d['key']}." if known else "Walking on."
                done = [*messages, summary_request(c.policy()), {"role": "assistant", "content": note}]
                rows.append((prompt, done[len(prompt) :]))
                prompt = summarised(messages, note)
                messages[:] = prompt
        result = act(f"open {d['key'] if known else rng.randint(1, c.boxes)}")
        if not result.done:
            raise AssertionError(f"the demonstration of {problem.id} did not reach the door")  # a bug
        return [*rows, (prompt, messages[len(prompt) :])]

    def score(self, problem: Problem, completion: str) -> Score:
        """A whole plan at once, one action per line, played from the start (no budget applies)."""
        env = self.make_env(problem)
        return play_plan(env, completion) or env.grade("no_more_moves")

    def demonstration(self, problem: Problem) -> str:
        return "\n".join(["look", *["walk"] * problem.data["length"], f"open {problem.data['key']}"])

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt}\n{self.demonstration(problem)}"


@functools.cache
def _held_out_keys(task: MemoryCorridorTask) -> frozenset[str]:
    c = task.config
    return frozenset(
        task.problem_key(task.problem(split, start + s))
        for split, start in (("test", c.test_seed), ("ood", c.ood_seed))
        for s in range(c.problems)
    )


class MemoryCorridorEnv:
    """One corridor (`data`: key, length, signs, max_steps), one action per policy turn."""

    stop = ()

    def __init__(self, config: MemoryCorridorConfig, data: dict[str, Any]):
        self.config, self.data = config, data
        self.context_budget: ContextPolicy | None = config.policy()
        self.position = 0
        self.steps = 0
        self.invalid = 0

    def reset(self) -> list[dict[str, Any]]:
        self.position = self.steps = self.invalid = 0
        return [{"role": "user", "content": PROMPT}]

    def _where(self) -> str:
        left = self.data["length"] - self.position
        return f"{left} to go." if left else f"At the door. Open 1-{self.config.boxes}."

    def step(self, action: str) -> StepResult:
        self.steps += 1
        words = action.strip().lower().split()
        signals = {"invalid": 0, "walked": 0}
        at_door = self.position == self.data["length"]
        if words == ["look"]:
            text = f"Key in box {self.data['key']}. {self._where()}"
        elif words == ["walk"] and not at_door:
            self.position += 1
            signals["walked"] = 1
            sign = (
                f" Sign {self.data['signs'][self.position - 1]}."
                if self.position < self.data["length"]
                else ""
            )
            text = self._where() + sign
        elif len(words) == 2 and words[0] == "open" and words[1].isdigit() and at_door:
            right = int(words[1]) == self.data["key"]
            return StepResult(
                done=True, signals=signals, score=self.grade("opened" if right else "wrong_box")
            )
        else:
            self.invalid += 1
            signals["invalid"] = 1
            text = "Not at the door." if words[:1] == ["open"] else "Say look, walk or open N."
        if self.steps >= self.data["max_steps"]:
            return StepResult(done=True, signals=signals, score=self.grade("step_limit"))
        return StepResult(messages=[{"role": "user", "content": text}], signals=signals)

    def summary_reward(self, text: str) -> float:
        """1 when the note names the key's box and no other box, else 0."""
        named = {int(n) for n in BOX.findall(text.lower())}
        return float(named == {self.data["key"]})

    def grade(self, reason: str) -> Score:
        won = reason == "opened"
        details = {"reason": reason, "steps": self.steps, "invalid_moves": self.invalid}
        return Score(float(won), won, self.invalid == 0, details)
