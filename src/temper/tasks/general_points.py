"""GeneralPoints, the card game of Chu et al. 2025, "SFT Memorizes, RL Generalizes" (arXiv:2501.17161).

Given cards, write an expression that uses each card's value exactly once with + - * / and
parentheses and equals the target (24 by default). A counts 1; the face cards follow a rule the
prompt states: in train/test J, Q and K all count 10, in ood J=11 Q=12 K=13 (the paper's rule
shift). A model that memorized "K means 10" fails ood; one that reads the rule does not.

Formats (values in the demonstration and corpus are those of the problem's rule):
    prompt         Cards: 3 8 K A. A=1 J=10 Q=10 K=10. Make 24 using each value once with + - * / ( ).
    demonstration  10-1=9, 9*8=72, 72/3=24\\nAnswer: (10-1)*8/3
                   (or, with `demonstration: trace`, a search that judges each step: `search_trace`)
    corpus_text    3 8 10 1 to 24: 10-1=9, 9*8=72, 72/3=24; (10-1)*8/3=24

The answer is an expression over the values (digits, not the letters A J Q K); an optional
trailing `=<target>` is accepted. No unary signs (see temper.tasks.expression).

Splits: only hands solvable under the split's rule are drawn, ranks i.i.d. uniform (a deck with
replacement). train/test draw ranks 1..max_rank and are separated by a hash of the sorted values
under the train rule, so "3 8 K A" and "A 3 J 8" are in the same split. ood draws the number
cards 1..min(max_rank, 10) plus J, Q, K whatever max_rank is (the rule shift needs face cards),
and every ood hand holds at least one face card.

Score reasons: "correct", "no_answer" (no `Answer:` line), "syntax_error", "division_by_zero",
"too_large" (the expression's), "wrong_face_value" (every number card used right, but a
face card valued otherwise than the prompt's rule: the rule misread, e.g. K=10 under K=13),
"wrong_cards" (any other literals that are not the card values as a multiset), "wrong_value"
(uses the cards but does not make the target, or claims `=N` for another N).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from itertools import combinations, permutations
from typing import ClassVar, NamedTuple

from temper.tasks.base import Problem, Score, check_split, split_of
from temper.tasks.expression import ExpressionError, evaluate, extract_answer

REASONS = (
    "correct",
    "no_answer",
    "syntax_error",
    "division_by_zero",
    "too_large",
    "wrong_cards",
    "wrong_face_value",
    "wrong_value",
)
FACES = (11, 12, 13)
_NAMES = {1: "A", 11: "J", 12: "Q", 13: "K"}
_MAX_TRIES = 10_000


@dataclass(frozen=True)
class GeneralPointsConfig:
    n_cards: int = 4
    """Cards per hand (2..4); fewer is easier."""
    target: int = 24
    """The value the expression must make."""
    max_rank: int = 13
    """Highest rank dealt in train/test (A=1 .. K=13); 10 deals no face cards there."""
    face_values_id: tuple[int, int, int] = (10, 10, 10)
    """Values of J, Q, K in train and test."""
    face_values_ood: tuple[int, int, int] = (11, 12, 13)
    """Values of J, Q, K in ood."""
    test_fraction: float = 0.2
    """Share of in-distribution hands (by sorted values) held out for test."""
    random_id_faces: bool = False
    """Train and test problems each draw their own J, Q, K values, i.i.d. uniform over 1..13 but
    never the ood triple, and the prompt states them: a model trained on these must read the
    rule, where one trained on a single rule can memorize it (ood keeps `face_values_ood`)."""
    demonstration: str = "steps"
    """What SFT imitates: `steps` (the solver's winning path) or `trace` (a search that judges
    each candidate step, see `search_trace`)."""
    trace_failures: int = 2
    """With `demonstration: trace`: how many rejected candidates each level shows at most."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "face_values_id", tuple(self.face_values_id))
        object.__setattr__(self, "face_values_ood", tuple(self.face_values_ood))
        if not 2 <= self.n_cards <= 4:
            raise ValueError("n_cards must be 2, 3 or 4")
        if self.target < 1:
            raise ValueError("target must be a positive integer")
        if not 1 <= self.max_rank <= 13:
            raise ValueError("max_rank must be in 1..13")
        for name in ("face_values_id", "face_values_ood"):
            values = getattr(self, name)
            if len(values) != 3 or any(v < 1 for v in values):
                raise ValueError(f"{name} must be three positive values for J, Q, K")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError("test_fraction must be in (0, 1)")
        if self.demonstration not in ("steps", "trace"):
            raise ValueError("demonstration must be 'steps' or 'trace'")
        if self.trace_failures < 0:
            raise ValueError("trace_failures must be >= 0")


@dataclass(frozen=True)
class GeneralPoints:
    """The card game; see the module docstring for formats, splits and score reasons."""

    config: GeneralPointsConfig = field(default_factory=GeneralPointsConfig)
    name: ClassVar[str] = "general_points"
    config_type: ClassVar[type] = GeneralPointsConfig

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` independent solvable hands (repeats possible); same seed, same problems."""
        check_split(split)
        c = self.config
        ranks = _ranks(c, split)
        rng = random.Random(f"{self.name}/{split}/{seed}")
        problems = []
        for _ in range(n):
            faces = _faces(rng, c, split)
            hand = _deal(rng, ranks, c, split, faces)
            cards = [_NAMES.get(r, str(r)) for r in hand]
            values = [value(r, faces) for r in hand]
            data = {
                "cards": cards,
                "values": values,
                "target": c.target,
                "face_values": list(faces),
            }
            pid = f"{','.join(cards)}:{c.target}:{','.join(map(str, faces))}"
            problems.append(Problem(self.name, split, pid, _prompt(cards, c.target, faces), data))
        return problems

    def score(self, problem: Problem, completion: str) -> Score:
        text = extract_answer(completion)
        if text is None:
            return _fail("no_answer", None)
        target = problem.data["target"]
        expression, _, claim = text.partition("=")
        claim = claim.strip()
        if "=" in text and not (claim.isascii() and claim.isdigit()):
            return _fail("syntax_error", text, parsed=False)
        try:
            result = evaluate(expression)
        except ExpressionError as error:
            return _fail(error.reason, text, parsed=error.reason != "syntax_error")
        details = {"answer": text, "value": str(result.value)}
        if sorted(result.literals) != sorted(problem.data["values"]):
            misread = _misvalued_faces(problem.data, result.literals)
            return _fail("wrong_face_value" if misread else "wrong_cards", text, details=details)
        if result.value != target or (claim and (claim.lstrip("0") or "0") != str(target)):
            return _fail("wrong_value", text, details=details)
        return Score(1.0, True, True, {"reason": "correct", **details})

    def demonstration(self, problem: Problem) -> str:
        values, target = problem.data["values"], problem.data["target"]
        if self.config.demonstration == "trace":
            return search_trace(values, target, self.config.trace_failures)
        s = solve(values, target)
        return f"{', '.join(s.steps)}\nAnswer: {s.expression}"

    def corpus_text(self, problem: Problem) -> str:
        d = problem.data
        s = solve(d["values"], d["target"])
        hand = " ".join(map(str, d["values"]))
        return f"{hand} to {d['target']}: {', '.join(s.steps)}; {s.expression}={d['target']}"


def _misvalued_faces(data: dict, literals: tuple[int, ...]) -> bool:
    """Whether the literals are the number cards' values plus values for the face cards that some
    rule could give (each rank one value): every number card used right, the rule misread."""
    cards, values = data["cards"], data["values"]
    faces = [c for c in cards if c in ("J", "Q", "K")]
    left = Counter(literals)
    left.subtract(v for c, v in zip(cards, values, strict=True) if c not in ("J", "Q", "K"))
    if not faces or len(literals) != len(values) or min(left.values(), default=0) < 0:
        return False
    return any(
        len({(card, v) for card, v in zip(faces, order, strict=True)}) == len(set(faces))
        for order in permutations(left.elements())
    )


def _fail(reason: str, answer: str | None, parsed: bool = True, details: dict | None = None) -> Score:
    parsed = parsed and reason != "no_answer"
    return Score(0.0, False, parsed, {**(details or {}), "reason": reason, "answer": answer})


def value(rank: int, faces: tuple[int, ...]) -> int:
    """A card's value: its rank, or the rule's value for J, Q, K."""
    return faces[rank - 11] if rank in FACES else rank


def _prompt(cards: list[str], target: int, faces: tuple[int, ...]) -> str:
    rule = " ".join(f"{_NAMES[r]}={v}" for r, v in zip((1, *FACES), (1, *faces), strict=True))
    return f"Cards: {' '.join(cards)}. {rule}. Make {target} using each value once with + - * / ( )."


def _ranks(c: GeneralPointsConfig, split: str) -> tuple[int, ...]:
    if split == "ood":
        return (*range(1, min(c.max_rank, 10) + 1), *FACES)
    return tuple(range(1, c.max_rank + 1))


def _faces(rng: random.Random, c: GeneralPointsConfig, split: str) -> tuple[int, ...]:
    """The J, Q, K values of the next problem: the split's rule, or a fresh draw (random_id_faces)."""
    if split == "ood":
        return c.face_values_ood
    if not c.random_id_faces:
        return c.face_values_id
    while True:
        faces = tuple(rng.randint(1, 13) for _ in FACES)
        if faces != c.face_values_ood:
            return faces


def _deal(
    rng: random.Random, ranks: tuple[int, ...], c: GeneralPointsConfig, split: str, faces: tuple[int, ...]
) -> list[int]:
    for _ in range(_MAX_TRIES):
        hand = rng.choices(ranks, k=c.n_cards)
        if _accepts(c, split, tuple(sorted(hand)), faces):
            return hand
    raise ValueError(f"no solvable {split} hand found for {c}; is the split empty?")


@cache
def _accepts(c: GeneralPointsConfig, split: str, hand: tuple[int, ...], faces: tuple[int, ...]) -> bool:
    """Whether a sorted hand belongs to `split` under the face values `faces`: in its part of the
    hash (of the sorted values, so train and test never share a value multiset), and solvable."""
    if split == "ood":
        return any(r in FACES for r in hand) and solvable([value(r, faces) for r in hand], c.target)
    values = sorted(value(r, faces) for r in hand)
    key = f"{c.target}:{','.join(map(str, values))}"
    return split_of(key, c.test_fraction) == split and solvable(values, c.target)


# --- solver -------------------------------------------------------------------------------


class Solution(NamedTuple):
    """A way to make the target: pairwise steps in order, and the one-line expression."""

    steps: tuple[str, ...]
    expression: str


def solvable(values: list[int] | tuple[int, ...], target: int) -> bool:
    """Whether the values, each used once, can make `target` with + - * / (exact rationals)."""
    return _solvable(tuple(sorted(Fraction(v) for v in values)), Fraction(target))


@cache
def _solvable(values: tuple[Fraction, ...], target: Fraction) -> bool:
    """Meet in the middle: for each split, ask whether the larger side reaches what the smaller
    side needs, instead of building the full reachable set of the whole hand."""
    if len(values) <= 3:
        return target in _reach(values)
    for small, large in _splits(values):
        reach = _reach(large)
        for a in _reach(small):
            if any(need in reach for need in _needs(a, target)):
                return True
    return False


@cache
def _reach(values: tuple[Fraction, ...]) -> frozenset[Fraction]:
    """Every value a sorted multiset can make, each element used once."""
    if len(values) == 1:
        return frozenset(values)
    out: set[Fraction] = set()
    for small, large in _splits(values):
        for a in _reach(small):
            for b in _reach(large):
                out.update(v for _, _, v in _results(a, b))
    return frozenset(out)


def _splits(values: tuple[Fraction, ...]):
    """Each split of a sorted multiset into two non-empty sorted parts, the smaller first."""
    n = len(values)
    seen = set()
    for k in range(1, n // 2 + 1):
        for idx in combinations(range(n), k):
            small = tuple(values[i] for i in idx)
            large = tuple(values[i] for i in range(n) if i not in idx)
            if (small, large) not in seen:
                seen.add((small, large))
                yield small, large


def _needs(a: Fraction, target: Fraction) -> list[Fraction]:
    """The values r with a+r, a-r, r-a, a*r, a/r or r/a equal to target (target != 0)."""
    needs = [target - a, a - target, target + a]
    if a != 0:
        needs += [target / a, a / target, target * a]
    return needs


def _results(a: Fraction, b: Fraction):
    """(swapped, op, value) for each way to combine a and b, in the solver's preferred order;
    `swapped` means the expression is `b op a`."""
    yield False, "+", a + b
    yield False, "-", a - b
    yield False, "*", a * b
    if b != 0:
        yield False, "/", a / b
    if a != b:
        yield True, "-", b - a
        if a != 0:
            yield True, "/", b / a


class _Node(NamedTuple):
    value: Fraction
    text: str
    op: str | None  # the top operator of `text`; None for a single number


def solve(values: list[int] | tuple[int, ...], target: int) -> Solution:
    """The demonstrated solution, the same for any order of the same values.

    Depth-first over pairwise combinations from the values sorted high to low, pruned by
    `_solvable`, first preferring non-negative integer steps, then non-negative ones, then any:
    the simplest arithmetic to imitate. Raises ValueError for an unsolvable hand.
    """
    return _solve(tuple(sorted(values, reverse=True)), target)


@cache
def _solve(values: tuple[int, ...], target: int) -> Solution:
    nodes = tuple(_Node(Fraction(v), str(v), None) for v in values)
    for allowed in (_natural, _non_negative, _any):
        found = _search(nodes, Fraction(target), allowed)
        if found is not None:
            return Solution(tuple(found[0]), found[1])
    raise ValueError(f"{list(values)} cannot make {target}")


def _natural(v: Fraction) -> bool:
    return v >= 0 and v.denominator == 1


def _non_negative(v: Fraction) -> bool:
    return v >= 0


def _any(v: Fraction) -> bool:
    return True


def _search(nodes: tuple[_Node, ...], target: Fraction, allowed) -> tuple[list[str], str] | None:
    if len(nodes) == 1:
        return ([], nodes[0].text) if nodes[0].value == target else None
    for i, j in combinations(range(len(nodes)), 2):
        rest = [n for k, n in enumerate(nodes) if k not in (i, j)]
        for swapped, op, v in _results(nodes[i].value, nodes[j].value):
            if not allowed(v):
                continue
            left, right = (nodes[j], nodes[i]) if swapped else (nodes[i], nodes[j])
            merged = sorted([*rest, _combine(left, op, right, v)], key=lambda n: -n.value)
            if not _solvable(tuple(sorted(n.value for n in merged)), target):
                continue
            found = _search(tuple(merged), target, allowed)
            if found is not None:
                step = f"{_operand(left.value)}{op}{_operand(right.value)}={_number(v)}"
                return [step, *found[0]], found[1]
    return None


def _combine(left: _Node, op: str, right: _Node, v: Fraction) -> _Node:
    """The node for `left op right`, with only the parentheses precedence requires."""
    prec = {"+": 1, "-": 1, "*": 2, "/": 2}
    left_text = f"({left.text})" if left.op and prec[left.op] < prec[op] else left.text
    wrap_right = right.op and (prec[right.op] < prec[op] or (prec[right.op] == prec[op] and op in "-/"))
    right_text = f"({right.text})" if wrap_right else right.text
    return _Node(v, f"{left_text}{op}{right_text}", op)


def _number(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def _operand(v: Fraction) -> str:
    """A step operand; fractions and negatives in parentheses so `a/(24/5)` reads right."""
    return _number(v) if _natural(v) else f"({_number(v)})"


# --- search trace -------------------------------------------------------------------------


def search_trace(values: list[int] | tuple[int, ...], target: int, failures: int = 2) -> str:
    """A short search to imitate (Stream of Search, Gandhi et al. 2024, on Countdown): the values
    high to low, then at each level the candidate steps in a fixed order, each with the numbers it
    leaves and whether they can still make the target, down to the first that can; the last two
    numbers are combined directly. Only the `failures` rejected candidates just before the chosen
    one are shown, so a 4-card trace fits a 256-token row.

        10 8 5 1
        10+8=18 [18 5 1] no
        10-8=2 [5 2 1] yes
        5+2=7 [7 1] no
        5*2=10 [10 1] yes
        10*1=10
        Answer: 5*(10-8)*1

    Why: the winning path alone asks a model to guess the first step of a hand it never saw; the
    verdicts judge smaller states (3 or 2 numbers), which recur across hands and splits, so what
    is learned there transfers. Raises ValueError for an unsolvable hand.
    """
    goal = Fraction(target)
    nodes = sorted((_Node(Fraction(v), str(v), None) for v in values), key=lambda n: -n.value)
    if not _solvable(tuple(sorted(n.value for n in nodes)), goal):
        raise ValueError(f"{list(values)} cannot make {target}")
    lines = [" ".join(_number(n.value) for n in nodes)]
    while len(nodes) > 1:
        candidates = _candidates(nodes)
        if len(nodes) == 2:
            step, node, _ = next(c for c in candidates if c[1].value == goal)
            lines.append(step)
            nodes = [node]
            break
        judged = [(*c, _solvable(tuple(sorted(n.value for n in c[2])), goal)) for c in candidates]
        natural = [c for c in judged if _natural(c[1].value)]
        pool = natural if any(c[3] for c in natural) else judged
        chosen = next(i for i, c in enumerate(pool) if c[3])
        for step, _, state, ok in pool[max(0, chosen - failures) : chosen + 1]:
            lines.append(f"{step} [{' '.join(_number(n.value) for n in state)}] {'yes' if ok else 'no'}")
        nodes = pool[chosen][2]
    lines.append(f"Answer: {nodes[0].text}")
    return "\n".join(lines)


def _candidates(nodes: list[_Node]) -> list[tuple[str, _Node, list[_Node]]]:
    """(step text, new node, the state it leaves sorted high to low) for each pairwise step of a
    state sorted high to low, pairs in order and operators in the solver's order; a step that
    leaves the same numbers as an earlier one is dropped."""
    out, seen = [], set()
    for i, j in combinations(range(len(nodes)), 2):
        rest = [n for k, n in enumerate(nodes) if k not in (i, j)]
        for swapped, op, v in _results(nodes[i].value, nodes[j].value):
            left, right = (nodes[j], nodes[i]) if swapped else (nodes[i], nodes[j])
            node = _combine(left, op, right, v)
            state = sorted([*rest, node], key=lambda n: -n.value)
            key = tuple(n.value for n in state)
            if key in seen:
                continue
            seen.add(key)
            out.append((f"{_operand(left.value)}{op}{_operand(right.value)}={_number(v)}", node, state))
    return out
