"""A task in a synthetic language (`temper.tasks.language`): the base task's prompts,
demonstrations and corpus text translated, its completions read back and graded by the base
task's own verifier.

    arithmetic_cy: {task: translated, base: arithmetic, options: {max_digits: 2}, script: cyrillic}

So a base can be taught a language it has never read (continued pre-training on a `corpus.mix`
of the old and the new, the seed's 7-5) and a model asked in it can be graded exactly. Problems
keep the base task's ids and data (the same problem in another language); their `prompt` and
`chat` are translated. `score` also reports `language_share` (the share of the completion's
letters and digits written in this language's script, `Language.share_of`), so an eval shows
whether a model answered in the language it was asked in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.tasks.base import Fingerprinted, Problem, Score, TaskOptionError, inner_task
from temper.tasks.language import SCRIPTS, Language


@dataclass(frozen=True)
class TranslatedConfig:
    base: str = "arithmetic"
    """The task whose problems and verifier are used (any task with demonstrations)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The base task's options."""
    script: str = "cyrillic"
    """The script the language writes in (`temper.tasks.language.SCRIPTS`)."""
    seed: int = 0
    """Which language of that script (the seeded letter map)."""

    def __post_init__(self) -> None:
        if self.script not in SCRIPTS:
            raise TaskOptionError(("script",), f"unknown script {self.script!r}; valid: {', '.join(SCRIPTS)}")


@dataclass(frozen=True)
class Translated:
    """The base task in a synthetic language; see the module docstring."""

    config: TranslatedConfig
    inner: Any
    task_name: str = "translated"
    name: ClassVar[str] = "translated"
    config_type: ClassVar[type] = TranslatedConfig

    @classmethod
    def wrap(cls, config: TranslatedConfig, name: str, make_inner: Callable[[], Any]) -> Translated:
        """The task over the base task `make_inner()` builds (the catalog hands it over)."""
        inner = inner_task(cls.name, config.base, make_inner)
        if hasattr(inner, "make_env"):
            raise TaskOptionError(
                ("base",), f"task {config.base!r} is an environment: only single-turn tasks translate"
            )
        return cls(config, inner, name)

    @property
    def language(self) -> Language:
        return Language(self.config.script, self.config.seed)

    def fingerprint(self) -> str:
        return self.inner.fingerprint() if isinstance(self.inner, Fingerprinted) else ""

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        return [self._translated(p) for p in self.inner.sample(split, n, seed)]

    def _translated(self, problem: Problem) -> Problem:
        say = self.language.translate
        chat = None if problem.chat is None else [_content(m, say) for m in problem.chat]
        return dataclasses.replace(problem, task=self.task_name, prompt=say(problem.prompt), chat=chat)

    def original(self, problem: Problem) -> Problem:
        """The base task's problem (prompt and chat read back)."""
        back = self.language.back
        chat = None if problem.chat is None else [_content(m, back) for m in problem.chat]
        return dataclasses.replace(problem, task=self.config.base, prompt=back(problem.prompt), chat=chat)

    def score(self, problem: Problem, completion: str) -> Score:
        score = self.inner.score(self.original(problem), self.language.back(completion))
        details = {**score.details, "language_share": self.language.share_of(completion)}
        return dataclasses.replace(score, details=details)

    def demonstration(self, problem: Problem) -> str:
        return self.language.translate(self.inner.demonstration(self.original(problem)))

    def corpus_text(self, problem: Problem) -> str:
        return self.language.translate(self.inner.corpus_text(self.original(problem)))


def _content(message: dict[str, Any], rewrite: Callable[[str], str]) -> dict[str, Any]:
    content = message.get("content")
    return {**message, "content": rewrite(content)} if isinstance(content, str) else dict(message)
