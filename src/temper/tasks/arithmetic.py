"""Multi-digit integer arithmetic (+, -, *) on non-negative operands, with a length shift for OOD.

Formats, kept short because the built-in models read one byte per token:
    prompt         37+45=?
    demonstration  37+45=82\nAnswer: 82
    corpus_text    37+45=82        (pre-training notation: no chat, no `Answer:`)

Splits: train and test draw operands of `min_digits..max_digits` digits and are separated by a
hash of the canonical problem (37+45 and 45+37 are the same problem, so they land in the same
split); ood draws operands of exactly `ood_digits` digits, longer than anything in train, so it
measures length generalization. The second operand of `*` never has more than `mul_max_digits`
digits, in every split, so multiplication stays learnable for a tiny model. An operand's digit
count is uniform over its range, then its value uniform among numbers of that length, so short
operands are not drowned out by the far more numerous long ones.

Score reasons: "correct", "wrong" (a well-formed integer, not the result), "no_answer" (the
completion does not end with `Answer: <integer>`; `Answer: +082` is the integer 82).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import ClassVar

from temper.tasks.base import Problem, Score, check_split, split_of
from temper.tasks.expression import extract_answer

OPS = ("+", "-", "*")
REASONS = ("correct", "wrong", "no_answer")
_MAX_TRIES = 10_000
_INTEGER = re.compile(r"([+-]?)([0-9]+)")


@dataclass(frozen=True)
class ArithmeticConfig:
    ops: tuple[str, ...] = OPS
    """Operators to draw from, uniformly; a subset of + - *."""
    min_digits: int = 1
    """Fewest digits of an operand in train/test."""
    max_digits: int = 2
    """Most digits of an operand in train/test."""
    ood_digits: int = 3
    """Exact digit count of OOD operands; must exceed max_digits."""
    mul_max_digits: int = 1
    """Most digits of the second operand of *, in every split."""
    test_fraction: float = 0.2
    """Share of the in-distribution problem space held out for test."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError("need 1 <= min_digits <= max_digits")
        if self.ood_digits <= self.max_digits:
            raise ValueError("ood_digits must exceed max_digits (OOD operands are longer)")
        if self.mul_max_digits < 1:
            raise ValueError("mul_max_digits must be >= 1")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError("test_fraction must be in (0, 1)")


@dataclass(frozen=True)
class Arithmetic:
    """`a op b` with the integer result; see the module docstring for formats and splits."""

    config: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    name: ClassVar[str] = "arithmetic"
    config_type: ClassVar[type] = ArithmeticConfig

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` independent draws (repeats possible); same seed, same problems."""
        check_split(split)
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [self._draw(rng, split) for _ in range(n)]

    def _draw(self, rng: random.Random, split: str) -> Problem:
        for _ in range(_MAX_TRIES):
            a, op, b = self._operands(rng, split)
            if split == "ood" or split_of(_key(a, op, b), self.config.test_fraction) == split:
                return _problem(split, a, op, b)
        raise ValueError(f"no {split} problem found for {self.config}; is the split empty?")

    def _operands(self, rng: random.Random, split: str) -> tuple[int, str, int]:
        c = self.config
        op = rng.choice(c.ops)
        lo, hi = (c.ood_digits, c.ood_digits) if split == "ood" else (c.min_digits, c.max_digits)
        a = _number(rng, rng.randint(lo, hi))
        if op == "*":
            b_lo, b_hi = min(c.min_digits, c.mul_max_digits), min(c.max_digits, c.mul_max_digits)
            b = _number(rng, rng.randint(b_lo, b_hi))
        else:
            b = _number(rng, rng.randint(lo, hi))
        return a, op, b

    def score(self, problem: Problem, completion: str) -> Score:
        text = extract_answer(completion)
        match = _INTEGER.fullmatch(text) if text is not None else None
        if match is None:
            return Score(0.0, False, False, {"reason": "no_answer", "answer": text})
        sign, digits = match.groups()
        digits = digits.lstrip("0") or "0"
        given = f"-{digits}" if sign == "-" and digits != "0" else digits
        correct = given == str(problem.data["answer"])
        details = {"reason": "correct" if correct else "wrong", "answer": text}
        return Score(float(correct), correct, True, details)

    def demonstration(self, problem: Problem) -> str:
        """The worked equation in the pre-training notation, then the answer line: the model
        computes where its pre-trained skill lives and copies the result into the format."""
        return f"{self.corpus_text(problem)}\nAnswer: {problem.data['answer']}"

    def corpus_text(self, problem: Problem) -> str:
        d = problem.data
        return f"{d['a']}{d['op']}{d['b']}={d['answer']}"


def _number(rng: random.Random, digits: int) -> int:
    """Uniform over integers with exactly `digits` digits (0 counts as one digit)."""
    return rng.randrange(10) if digits == 1 else rng.randrange(10 ** (digits - 1), 10**digits)


def _key(a: int, op: str, b: int) -> str:
    """Canonical form: the operands of commutative ops sorted, so a+b and b+a share a split."""
    if op in "+*":
        a, b = sorted((a, b))
    return f"{a}{op}{b}"


def _problem(split: str, a: int, op: str, b: int) -> Problem:
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    data = {"a": a, "op": op, "b": b, "answer": answer}
    return Problem("arithmetic", split, f"{a}{op}{b}", f"{a}{op}{b}=?", data)
