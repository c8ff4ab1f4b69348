"""Write problems.jsonl: short arithmetic word problems with their answer and a worked solution.

    python examples/word_problems/make_problems.py          # 500 rows, seed 0

Kept in the built-in arithmetic task's style (operands of 1-2 digits drawn as it draws them, the
second operand of a product one digit, the solution `a+b=c` then `Answer: c`), so the tiny base pre-trained on that
notation only has to learn which operation the words ask for. Columns: question (the prompt),
answer (the reference the reward reads), completion (a demonstration for SFT), op.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

NAMES = ["Tom", "Ann", "Bo", "Eve", "Max", "Ida", "Sam", "Lu"]
THINGS = ["apples", "pens", "cards", "shells", "coins", "books", "eggs", "cups"]
TEMPLATES = {
    "+": ["{n} has {a} {t} and gets {b} more.", "{n} finds {a} {t}, then {b} more."],
    "-": ["{n} has {a} {t} and gives away {b}.", "{n} had {a} {t} and lost {b}."],
    "*": ["{n} has {a} bags of {b} {t}.", "{n} buys {a} boxes with {b} {t} each."],
}


def number(rng: random.Random, max_digits: int) -> int:
    """As the arithmetic task draws operands: the digit count uniform, then the value uniform among
    numbers of that length, so one-digit operands are half of them, not a tenth."""
    digits = rng.randint(1, max_digits)
    return rng.randrange(1, 10) if digits == 1 else rng.randrange(10 ** (digits - 1), 10**digits)


def problem(rng: random.Random) -> dict:
    op = rng.choice("+-*")
    a = number(rng, 2)
    b = number(rng, 1 if op == "*" else 2)
    if op == "-" and b > a:
        a, b = b, a  # no negative counts of things
    value = a + b if op == "+" else a - b if op == "-" else a * b
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    question = rng.choice(TEMPLATES[op]).format(n=name, a=a, b=b, t=thing) + f" How many {thing}?"
    return {
        "question": question,
        "answer": str(value),
        "completion": f"{a}{op}{b}={value}\nAnswer: {value}",
        "op": op,
    }


def main(n: int = 500, seed: int = 0) -> None:
    rng = random.Random(seed)
    out = Path(__file__).with_name("problems.jsonl")
    with out.open("w") as f:
        for _ in range(n):
            f.write(json.dumps(problem(rng)) + "\n")
    print(f"wrote {n} problems to {out}")


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:3]))
