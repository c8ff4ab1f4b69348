"""Synthetic languages: the same content in a script a base has never read and another word order.

For continued pre-training into a new language (the seed's 7-5, Mistral learning Korean) and
for thinking in a language the SFT data never used (7-7), with no real text to download: a
`Language` rewrites a text character by character into another Unicode script and reverses the
order of the words on every line, a bijection, so a model's answer written in it is read back
exactly and graded by the original task's verifier.

    Language("cyrillic", seed=0).translate("12+7=19\\nAnswer: 19")  ==  "ёѐуњбёщ\\nёщ Ѝеьпиш:"

What is rewritten: the 52 Latin letters, the 10 digits and the operators `+ - * / = ( )` (the
built-in tasks' notation), each to its own letter of the script, drawn by `seed` (another
seed: another language in the same script), upper and lower case kept apart as in the source
(`letter_map`). Spaces, newlines and the other punctuation stay, so
`Answer:` keeps its colon and a line keeps its words. With the byte-level tokenizer every
character of these scripts is two or three bytes the base has not seen (as Hangul is to a mostly
English model). A script's block must not already appear in the source text: `translate` refuses
text that holds one of its characters, so `back(translate(x)) == x` always holds.
"""

from __future__ import annotations

import random
import unicodedata
from dataclasses import dataclass
from functools import cached_property

LOWER = "abcdefghijklmnopqrstuvwxyz"
SINGLE = "0123456789+-*/=()"
SOURCE = LOWER + LOWER.upper() + SINGLE
"""The characters a language rewrites (everything else passes through)."""

SCRIPTS: dict[str, tuple[int, int]] = {
    "cyrillic": (0x0400, 0x0460),  # 2 UTF-8 bytes per character
    "greek": (0x0370, 0x0400),  # 2 bytes
    "georgian": (0x10A0, 0x1100),  # 3 bytes
}
"""Unicode blocks a language may write in: [first, end) code points; only assigned letters are used."""


def script_letters(script: str) -> list[str]:
    """The assigned letters of a script's block, in code-point order."""
    if script not in SCRIPTS:
        raise ValueError(f"unknown script {script!r}; valid scripts: {', '.join(SCRIPTS)}")
    first, end = SCRIPTS[script]
    return [chr(c) for c in range(first, end) if unicodedata.category(chr(c)).startswith("L")]


def letter_map(script: str, seed: int) -> dict[str, str]:
    """`SOURCE` -> distinct letters of `script`, drawn by `seed`, such that source characters
    with different lower cases get letters with different lower cases: a Latin pair goes to a
    cased pair of the script (then lower-casing commutes with the map: Cyrillic, Greek) or, in a
    caseless script (Georgian), to two caseless letters; a digit or an operator to a letter no
    other mapped letter lower-cases to. So text normalised by lower-casing (the contamination
    screen) never makes two different problems look alike."""
    groups: dict[str, list[str]] = {}
    for c in script_letters(script):
        groups.setdefault(c.lower(), []).append(c)
    rng = random.Random(f"language:{script}:{seed}")
    cased = [(low, next(c for c in g if c != low)) for low, g in groups.items() if low in g and len(g) > 1]
    caseless = [g[0] for g in groups.values() if len(g) == 1]
    rng.shuffle(cased)
    rng.shuffle(caseless)
    pairs = cased + [(caseless[2 * i], caseless[2 * i + 1]) for i in range(len(caseless) // 2)]
    if len(pairs) < len(LOWER):
        raise ValueError(f"script {script!r} has too few letters for a language")
    letters, spare = pairs[: len(LOWER)], pairs[len(LOWER) :]
    singles = [low for low, _ in spare] + (caseless[-1:] if len(caseless) % 2 else [])
    if len(singles) < len(SINGLE):
        raise ValueError(f"script {script!r} has too few letters for a language")
    forward = {src: low for src, (low, _) in zip(LOWER, letters, strict=False)}
    forward |= {src.upper(): up for src, (_, up) in zip(LOWER, letters, strict=False)}
    return forward | dict(zip(SINGLE, singles, strict=False))


@dataclass(frozen=True)
class Language:
    """A seeded bijection of `SOURCE` onto `script`'s letters, plus (`reverse_words`) reversed word
    order per line; without it, only the script changes (a worked trace keeps its steps' order)."""

    script: str = "cyrillic"
    seed: int = 0
    reverse_words: bool = True

    def __post_init__(self) -> None:
        script_letters(self.script)  # an unknown script fails here

    @cached_property
    def forward(self) -> dict[str, str]:
        return letter_map(self.script, self.seed)

    @cached_property
    def inverse(self) -> dict[str, str]:
        return {v: k for k, v in self.forward.items()}

    @cached_property
    def block(self) -> frozenset[str]:
        return frozenset(script_letters(self.script))

    def translate(self, text: str) -> str:
        """`text` in this language: characters rewritten, each line's words in reverse order."""
        if clash := next((c for c in text if c in self.block), None):
            raise ValueError(
                f"text already holds {clash!r} of the {self.script} script: its translation could not be read back"
            )
        said = "".join(self.forward.get(c, c) for c in text)
        return _reverse_words(said) if self.reverse_words else said

    def back(self, text: str) -> str:
        """The source text of a translation (or of a model's text in this language): the exact
        inverse of `translate`; characters of other scripts pass through unchanged."""
        return "".join(self.inverse.get(c, c) for c in (_reverse_words(text) if self.reverse_words else text))

    def share_of(self, text: str) -> float:
        """The share of `text`'s rewritable characters (letters, digits, operators, in either
        alphabet) written in this language's script: a language-ID score, 1.0 for a translation,
        0.0 for source text, in between for a mix; 0.0 for text with none."""
        ours = sum(c in self.inverse for c in text)
        theirs = sum(c in self.forward for c in text)
        return ours / (ours + theirs) if ours + theirs else 0.0


def _reverse_words(text: str) -> str:
    """Each line's space-separated words in reverse order (an involution: split on single spaces
    keeps empty words, so runs of spaces survive)."""
    return "\n".join(" ".join(reversed(line.split(" "))) for line in text.split("\n"))


def identify(text: str, languages: dict[str, Language]) -> str:
    """Which of `languages` `text` is written in: the one whose script holds most of its letters
    (any letter of the script's block counts, so a language-ID of a model's free text), `source`
    when Latin letters and digits outnumber every script, `none` for text with neither."""
    counts = {name: sum(c in lang.block for c in text) for name, lang in languages.items()}
    counts["source"] = sum(c in SOURCE and c not in "+-*/=()" for c in text)
    best = max(counts, key=counts.get)
    return best if counts[best] else "none"
