"""Thinking in a language the SFT data never used (the seed's 7-7: `reasoning language: German`
in the system prompt, SFT on traces in English, Spanish, French..., and the model thinks in
Chinese when asked). The base task's worked trace is written in the language the system prompt
names; the answer line stays in the base task's notation and is graded by its verifier.

    think: {task: thinking_language, base: arithmetic, languages: [cyrillic, greek, georgian],
            sft_languages: [cyrillic, greek], ood_languages: [georgian]}

Languages are `temper.tasks.language` scripts named by their script, with the word order kept
(a trace's steps stay in order). `languages` are those the task's corpus lines are written in
(pre-training: each train problem's line in one of them, by a hash of its id, prefixed with the
language's name, `greek: ...`, as web text comes with its language). The train and test problems
ask for one of `sft_languages` (by a hash of the id); the ood split asks the test problems for
one of `ood_languages`, never in the SFT data. Score details say which language the trace was
written in (`trace_language`, `language.identify` over every script and the source notation) and
whether it is the one asked for (`trace_in_asked`), so an eval shows whether the model followed
an instruction to think in a language it only ever read.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from temper.tasks.base import Fingerprinted, Problem, Score, TaskOptionError, check_split, inner_task
from temper.tasks.language import SCRIPTS, Language, identify

INSTRUCTION = "reasoning language: {language}"
"""The system turn that names the language to think in."""


@dataclass(frozen=True)
class ThinkingLanguageConfig:
    base: str = "arithmetic"
    """The task whose problems, worked traces and verifier are used."""
    options: dict[str, Any] = field(default_factory=dict)
    """The base task's options."""
    languages: list[str] = field(default_factory=lambda: ["cyrillic", "greek", "georgian"])
    """The languages (scripts) the corpus lines are written in, for pre-training."""
    sft_languages: list[str] = field(default_factory=lambda: ["cyrillic", "greek"])
    """The languages train and test problems ask the trace in (the SFT data's)."""
    ood_languages: list[str] = field(default_factory=lambda: ["georgian"])
    """The languages the ood split asks for: never in the SFT data."""
    seed: int = 0
    """The languages' letter maps."""

    def __post_init__(self) -> None:
        for key in ("languages", "sft_languages", "ood_languages"):
            names = getattr(self, key)
            if not names:
                raise TaskOptionError((key,), "give at least one language")
            if bad := [n for n in names if n not in SCRIPTS]:
                raise TaskOptionError((key,), f"unknown language {bad[0]!r}; valid: {', '.join(SCRIPTS)}")
        if both := set(self.sft_languages) & set(self.ood_languages):
            raise TaskOptionError(
                ("ood_languages",), f"{sorted(both)} also in sft_languages: ood must be unseen"
            )


@dataclass(frozen=True)
class ThinkingLanguage:
    """The base task with its trace in a language the system prompt names; see the module docstring."""

    config: ThinkingLanguageConfig
    inner: Any
    task_name: str = "thinking_language"
    name: ClassVar[str] = "thinking_language"
    config_type: ClassVar[type] = ThinkingLanguageConfig

    @classmethod
    def wrap(
        cls, config: ThinkingLanguageConfig, name: str, make_inner: Callable[[], Any]
    ) -> ThinkingLanguage:
        inner = inner_task(cls.name, config.base, make_inner)
        if hasattr(inner, "make_env") or not hasattr(inner, "demonstration"):
            raise TaskOptionError(("base",), f"task {config.base!r} has no single-turn worked demonstrations")
        return cls(config, inner, name)

    def language(self, name: str) -> Language:
        return Language(name, self.config.seed, reverse_words=False)

    def fingerprint(self) -> str:
        return self.inner.fingerprint() if isinstance(self.inner, Fingerprinted) else ""

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        check_split(split)
        asked = self.config.ood_languages if split == "ood" else self.config.sft_languages
        base = self.inner.sample("test" if split == "ood" else split, n, seed)
        return [self._asked(p, _pick(asked, f"ask:{p.id}"), split) for p in base]

    def _asked(self, problem: Problem, language: str, split: str) -> Problem:
        chat = [{"role": "system", "content": INSTRUCTION.format(language=language)}, *problem.messages()]
        data = {**problem.data, "reasoning_language": language}
        return dataclasses.replace(problem, task=self.task_name, split=split, chat=chat, data=data)

    def original(self, problem: Problem) -> Problem:
        data = {k: v for k, v in problem.data.items() if k != "reasoning_language"}
        return dataclasses.replace(problem, task=self.config.base, chat=None, data=data)

    def demonstration(self, problem: Problem) -> str:
        *trace, answer = self.inner.demonstration(self.original(problem)).split("\n")
        say = self.language(problem.data["reasoning_language"]).translate
        return "\n".join([say(line) for line in trace] + [answer])

    def score(self, problem: Problem, completion: str) -> Score:
        score = self.inner.score(self.original(problem), completion)
        trace = completion.rsplit("\n", 1)[0] if "\n" in completion else ""
        languages = {n: self.language(n) for n in SCRIPTS}
        found = identify(trace, languages)
        asked = problem.data["reasoning_language"]
        details = {**score.details, "trace_language": found, "trace_in_asked": found == asked}
        return dataclasses.replace(score, details=details)

    def corpus_text(self, problem: Problem) -> str:
        language = _pick(self.config.languages, f"corpus:{problem.id}")
        text = self.inner.corpus_text(self.original(problem))
        return f"{language}: {self.language(language).translate(text)}"


def _pick(names: list[str], key: str) -> str:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return names[int.from_bytes(digest, "little") % len(names)]
