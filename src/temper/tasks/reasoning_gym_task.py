"""Any `reasoning-gym` data set as a temper task, graded by its own verifier (`score_answer`).

    legs: {task: reasoning_gym, dataset: leg_counting, size: 500, seed: 1, config: {max_animals: 3}}

reasoning-gym (Stojanovski et al. 2025, github.com/open-thought/reasoning-gym) generates problems
procedurally: `create_dataset(name, size=, seed=, **config)` gives `size` entries (question,
answer, metadata) and the data set's `score_answer(answer, entry)` grades an answer in [0, 1].
The `size` entries are split into train and test by a stable hash of the question
(`test_fraction`), so the two never share a problem; there is no ood split.

The model answers on a final `Answer: ...` line, as in every temper task (reasoning-gym's own
`<answer>...</answer>` tags are read too). reward = score_answer; correct = reward >= 1;
parsed = an answer was found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from temper.tasks.base import Problem, Score, TaskOptionError, check_split, draw, split_of
from temper.tasks.expression import extract_answer

_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INSTRUCTION = "\nEnd your response with a line 'Answer: <your answer>'."


@dataclass(frozen=True)
class ReasoningGymConfig:
    dataset: str = ""
    """The reasoning-gym data set's name (e.g. leg_counting, basic_arithmetic, chain_sum)."""
    size: int = 500
    """Entries generated (train and test together)."""
    seed: int = 1
    """Generation seed."""
    config: dict[str, Any] = field(default_factory=dict)
    """The data set's own options (its config class's fields, e.g. max_animals)."""
    test_fraction: float = 0.2
    """Share of the entries held out for test, by a hash of the question."""
    instruction: bool = True
    """Append the answer-format instruction to each question."""

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise TaskOptionError(("test_fraction",), "test_fraction must be in (0, 1)")
        if self.size < 1:
            raise TaskOptionError(("size",), "size must be >= 1")


class ReasoningGym:
    """One reasoning-gym data set; see the module docstring."""

    config_type: ClassVar[type] = ReasoningGymConfig

    def __init__(self, config: ReasoningGymConfig, name: str = "reasoning_gym"):
        self.config, self.name = config, name
        try:
            import reasoning_gym
        except ImportError:
            raise TaskOptionError(
                ("task",),
                "task reasoning_gym needs the reasoning-gym package: pip install 'temper[reasoning_gym]'",
            ) from None
        from reasoning_gym.factory import DATASETS

        if config.dataset not in DATASETS:
            import difflib

            near = difflib.get_close_matches(config.dataset, list(DATASETS), n=1)
            raise TaskOptionError(
                ("dataset",),
                f"unknown reasoning-gym data set {config.dataset!r}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + f"; {len(DATASETS)} exist, e.g. {', '.join(sorted(DATASETS)[:8])}",
            )
        try:
            self.dataset = reasoning_gym.create_dataset(
                config.dataset, size=config.size, seed=config.seed, **config.config
            )
        except (TypeError, ValueError, AssertionError) as err:
            raise TaskOptionError(("config",), f"reasoning-gym {config.dataset!r}: {err}") from None
        self._splits: dict[str, list[Problem]] = {"train": [], "test": [], "ood": []}
        for i in range(len(self.dataset)):
            entry = self.dataset[i]
            split = split_of(f"{config.dataset}/{entry['question']}", config.test_fraction)
            prompt = entry["question"] + (INSTRUCTION if config.instruction else "")
            self._splits[split].append(
                Problem(self.name, split, f"{config.dataset}/{i}", prompt, {"entry": entry})
            )

    @classmethod
    def build(cls, config: ReasoningGymConfig, name: str, base_dir: Path | None) -> ReasoningGym:
        return cls(config, name)

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """test: a seeded subset without repeats; train: seeded shuffles, cycled to `n`."""
        check_split(split)
        rows = self._splits[split]
        if not rows:
            raise ValueError(
                f"task {self.name!r} has no {split} problems (reasoning-gym gives train and test)"
            )
        return draw(rows, f"{self.name}/{split}/{seed}", n, repeat=split == "train")

    def score(self, problem: Problem, completion: str) -> Score:
        answer = _answer(completion)
        if answer is None:
            return Score(0.0, False, False, {"reason": "no_answer", "answer": None})
        reward = float(self.dataset.score_answer(answer, problem.data["entry"]))
        correct = reward >= 1.0
        return Score(reward, correct, True, {"reason": "correct" if correct else "wrong", "answer": answer})

    def demonstration(self, problem: Problem) -> str:
        return f"Answer: {problem.data['entry']['answer']}"

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.data['entry']['question']}\n{problem.data['entry']['answer']}"


def _answer(completion: str) -> str | None:
    tagged = _TAGGED.findall(completion)
    if tagged:
        return tagged[-1].strip() or None
    return extract_answer(completion)
