"""A task in two answer modes, for adaptive thinking (AdaptThink, `temper.algorithms.adaptthink`):

    thinking   Think: 37+45=82\\nAnswer: 82     the base task's worked demonstration after a marker
    direct     Answer: 82                      the answer line alone

The mode is the completion's first token: the first token of `THINK` or of `DIRECT` (with the
byte-level tokenizer of the built-in models, `T` or `A`). Both markers are explicit text so that
the mode of any completion can be read off it, the rollout can force either one as the first
token (AdaptThink's importance sampling), and a BPE tokenizer still gives them different first
tokens. The thinking marker is ours (AdaptThink's models mark the direct mode with an empty
`<think></think>` and start thinking with "Alright"); the direct marker is the base task's own
answer line, so grading is the base task's, unchanged: both modes end with `Answer: ...`.

Options: `base` (the task it wraps, e.g. arithmetic), `options` (the base task's options) and
`direct_share`, the share of demonstrations written in the direct mode (chosen per problem by a
hash of its id, so independent of difficulty: SFT teaches both modes everywhere and RL decides
where each one pays). Problems carry this task's name; their data is the base task's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from temper.tasks.base import Fingerprinted, Problem, Score, TaskOptionError, inner_task

THINK = "Think:"
"""The thinking mode's first text: the worked solution follows."""
DIRECT = "Answer:"
"""The direct mode's first text: the answer line of every built-in task."""

Mode = Literal["think", "direct", "other"]


def mode_of(completion: str) -> Mode:
    """The mode a completion's text starts in ("other": neither marker)."""
    text = completion.lstrip()
    return "direct" if text.startswith(DIRECT) else "think" if text.startswith(THINK) else "other"


def marker_ids(tokenizer) -> tuple[int, int]:
    """(direct, think): the first token of each marker; they must differ, since the mode is chosen
    by the first token."""
    direct = tokenizer.encode(DIRECT, add_special_tokens=False)[0]
    think = tokenizer.encode(THINK, add_special_tokens=False)[0]
    if direct == think:
        raise ValueError(f"the tokenizer starts {DIRECT!r} and {THINK!r} with the same token {direct}")
    return direct, think


@dataclass(frozen=True)
class TwoModeConfig:
    base: str = "arithmetic"
    """The task whose problems, grading and worked demonstrations are used (e.g. arithmetic, general_points)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The base task's options."""
    direct_share: float = 0.5
    """Share of demonstrations in the direct mode (by a hash of the problem id)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.direct_share <= 1.0:
            raise TaskOptionError(("direct_share",), f"must be in [0, 1], got {self.direct_share}")


@dataclass(frozen=True)
class TwoMode:
    """The base task with demonstrations in two modes; see the module docstring."""

    config: TwoModeConfig
    inner: Any
    task_name: str = "two_mode"
    name: ClassVar[str] = "two_mode"
    config_type: ClassVar[type] = TwoModeConfig

    @classmethod
    def wrap(cls, config: TwoModeConfig, name: str, make_inner: Callable[[], Any]) -> TwoMode:
        """The task over the base task `make_inner()` builds (`temper.catalog.make_task` of
        `config.base` with `config.options`: the catalog hands it over, as it sits above this layer)."""
        inner = inner_task(cls.name, config.base, make_inner)
        if not hasattr(inner, "demonstration"):
            raise TaskOptionError(("base",), f"task {config.base!r} has no worked demonstrations")
        return cls(config, inner, name)

    def fingerprint(self) -> str:
        """The base task's (what it reads beyond its options: a data task's rows), if it has one."""
        return self.inner.fingerprint() if isinstance(self.inner, Fingerprinted) else ""

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        return [dataclasses.replace(p, task=self.task_name) for p in self.inner.sample(split, n, seed)]

    def score(self, problem: Problem, completion: str) -> Score:
        return self.inner.score(problem, completion)

    def demonstration(self, problem: Problem) -> str:
        worked = self.inner.demonstration(problem)
        answer = worked.rsplit("\n", 1)[-1]
        if not answer.startswith(DIRECT):
            raise ValueError(
                f"{self.config.base} demonstrations must end with an {DIRECT!r} line, got {answer!r}"
            )
        return answer if self.direct(problem) else f"{THINK} {worked}"

    def direct(self, problem: Problem) -> bool:
        """Whether `problem`'s demonstration is in the direct mode (a hash of its id)."""
        digest = hashlib.blake2b(f"two_mode/{problem.id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2**64 < self.config.direct_share

    def corpus_text(self, problem: Problem) -> str:
        return self.inner.corpus_text(problem)
