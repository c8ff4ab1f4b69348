"""Synthetic code-repair tasks: a templated function with one seeded bug, its reference fix, a
visible test and hidden tests.

A task's "repository" is two files (kept tiny for a 1M-parameter, byte-level policy):

    sol.py                                  test_sol.py
    1 def f(a, b):                          1 from sol import f
    2     # a * 3 + b                       2 assert f(2, 5) == 11
    3     return a * 3 - b

The comment on line 2 is the function's specification (what the tests check), so the fix is
readable from the file: a repair copies the intended expression into the buggy line. The hidden
tests (inputs and expected outputs) stay with the environment and are never written to the
workspace; the visible test is one input on which the bug and the fix differ.

Shapes (the function templates), each with the lines a bug may hit:
- expr:   `return a OP K OP b`
- branch: `if a CMP b:` / `return a OP b` / `return b OP K`
- loop:   `for i in range(n):` / `s += i OP K` (a sum over range(n))
- clamp:  `y = x OP K` / `if y CMP L:` (min(x OP K, L))

Bug families (each a rewrite of one token of one code line):
- op_swap: a binary operator replaced by another (+ - *)
- off_by_one: an integer literal moved by one, or `range(n)` -> `range(n + 1)` / `range(n - 1)`
- wrong_constant: an integer literal replaced by another at least 2 away
- wrong_comparison: a comparison replaced by another (> >= < <=)

A family that has no site in a shape (wrong_comparison in expr) cannot make a bug there: the
generator draws another. Some drawn bugs change nothing the hidden tests can see (`y >= L` for
`y > L` in clamp returns L either way at y == L); the fail-to-pass gate (admission.py) rejects
them. Expected outputs are computed here by running the reference source, which is this module's
own template text (trusted); everything the agent may have touched runs only in the sandbox.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from temper.tasks.base import Problem

SOLUTION = "sol.py"
TESTS = "test_sol.py"

SHAPES = ("expr", "branch", "loop", "clamp")
FAMILIES = ("op_swap", "off_by_one", "wrong_constant", "wrong_comparison")

_OPS = ("+", "-", "*")
_CMPS = (">", ">=", "<", "<=")


@dataclass(frozen=True)
class RepairTask:
    """One generated task. `buggy` / `fixed`: the sol.py sources; `line`: the 1-based line the bug
    is on and `fix_text` its reference text; `visible`: the one input of test_sol.py and
    `visible_want` its expected output; `hidden`: inputs and expected outputs of the oracle."""

    shape: str
    family: str
    buggy: str
    fixed: str
    line: int
    fix_text: str
    visible: tuple[int, ...]
    visible_want: int
    hidden: tuple[tuple[tuple[int, ...], int], ...]

    @property
    def test_source(self) -> str:
        return test_source(self.visible, self.visible_want)

    def files(self) -> dict[str, str]:
        """The workspace at the start of an episode."""
        return {SOLUTION: self.buggy, TESTS: self.test_source}


def task_of(problem: Problem) -> RepairTask:
    """The task a problem holds (its data is the task's fields, `asdict(task)`)."""
    d = problem.data
    return RepairTask(
        shape=d["shape"],
        family=d["family"],
        buggy=d["buggy"],
        fixed=d["fixed"],
        line=d["line"],
        fix_text=d["fix_text"],
        visible=tuple(d["visible"]),
        visible_want=d["visible_want"],
        hidden=tuple((tuple(a), w) for a, w in d["hidden"]),
    )


def test_source(args: tuple[int, ...], want: int) -> str:
    return f"from sol import f\nassert f({', '.join(map(str, args))}) == {want}\n"


def _shape_lines(shape: str, rng: random.Random) -> tuple[list[str], list[int], int]:
    """The reference source of `shape` with drawn operators and constants, the 0-based indices of
    the lines a bug may hit, and the function's arity."""
    op = lambda: rng.choice(_OPS)  # noqa: E731
    k = lambda: rng.randint(2, 9)  # noqa: E731
    if shape == "expr":
        e = f"a {op()} {k()} {op()} b"
        return ["def f(a, b):", f"    # {e}", f"    return {e}"], [2], 2
    if shape == "branch":
        c, o1, o2, kk = rng.choice(_CMPS), op(), op(), k()
        spec = f"a {o1} b if a {c} b else b {o2} {kk}"
        lines = [
            "def f(a, b):",
            f"    # {spec}",
            f"    if a {c} b:",
            f"        return a {o1} b",
            f"    return b {o2} {kk}",
        ]
        return lines, [2, 3, 4], 2
    if shape == "loop":
        o, kk = op(), k()
        lines = [
            "def f(n):",
            f"    # sum(i {o} {kk} for i in range(n))",
            "    s = 0",
            "    for i in range(n):",
            f"        s += i {o} {kk}",
            "    return s",
        ]
        return lines, [3, 4], 1
    if shape == "clamp":
        o, kk, lim, c = op(), k(), rng.randint(10, 30), rng.choice((">", ">="))
        lines = [
            "def f(x):",
            f"    # min(x {o} {kk}, {lim})",
            f"    y = x {o} {kk}",
            f"    if y {c} {lim}:",
            f"        return {lim}",
            "    return y",
        ]
        return lines, [2, 3], 1
    raise ValueError(f"unknown shape {shape!r}; valid shapes: {', '.join(SHAPES)}")


_OP_SITE = re.compile(r"(?<= )[+\-*](?= )")
_CMP_SITE = re.compile(r"(?<= )(>=|<=|>|<)(?= )")
_INT_SITE = re.compile(r"(?<![\w.])\d+(?![\w.])")
_RANGE_SITE = re.compile(r"range\(n\)")


def mutations(family: str, line: str) -> list[str]:
    """Every rewrite of `line` the family can make (empty when it has no site there)."""
    out: list[str] = []

    def at(m: re.Match, text: str) -> str:
        return line[: m.start()] + text + line[m.end() :]

    if family == "op_swap":
        out = [at(m, o) for m in _OP_SITE.finditer(line) for o in _OPS if o != m.group()]
    elif family == "wrong_comparison":
        out = [at(m, c) for m in _CMP_SITE.finditer(line) for c in _CMPS if c != m.group()]
    elif family == "off_by_one":
        out = [at(m, str(int(m.group()) + d)) for m in _INT_SITE.finditer(line) for d in (-1, 1)]
        out += [at(m, f"range(n {s} 1)") for m in _RANGE_SITE.finditer(line) for s in "+-"]
    elif family == "wrong_constant":
        for m in _INT_SITE.finditer(line):
            v = int(m.group())
            out += [at(m, str(w)) for w in range(max(0, v - 5), v + 6) if abs(w - v) >= 2]
    else:
        raise ValueError(f"unknown bug family {family!r}; valid families: {', '.join(FAMILIES)}")
    return out


def run_reference(source: str, args: tuple[int, ...]) -> int | None:
    """f(*args) of a source this module generated (never the agent's: that runs in the sandbox);
    None when it raises."""
    scope: dict = {}
    exec(compile(source, SOLUTION, "exec"), scope)  # noqa: S102 - the generator's own template text
    try:
        return scope["f"](*args)
    except Exception:
        return None


def bug_sites(shape: str) -> tuple[list[int], int]:
    """The 0-based lines a bug may hit in `shape` and its arity (neither depends on the draw)."""
    _, at, arity = _shape_lines(shape, random.Random(0))
    return at, arity


def _inputs(arity: int, rng: random.Random) -> tuple[int, ...]:
    if arity == 1:
        return (rng.randint(0, 9),)
    return (rng.randint(-3, 9), rng.randint(-3, 9))


def generate(shape: str, family: str, seed: int | str, n_hidden: int = 6) -> RepairTask | None:
    """One task of `shape` with a `family` bug, a pure function of its arguments; None when the
    family has no site in the shape. The visible input is one where bug and fix differ (when the
    drawn inputs have none, the first drawn input: admission rejects such a task). Hidden tests
    are `n_hidden` other seeded inputs; whether they catch the bug is admission's question."""
    rng = random.Random(f"code_repair:{shape}:{family}:{seed}")
    lines, sites, arity = _shape_lines(shape, rng)
    choices = [(i, m) for i in sites for m in mutations(family, lines[i])]
    if not choices:
        return None
    i, mutated = rng.choice(choices)
    return build(shape, family, lines, i, mutated, arity, rng, n_hidden)


def build(
    shape: str,
    family: str,
    lines: list[str],
    i: int,
    mutated: str,
    arity: int,
    rng: random.Random,
    n_hidden: int = 6,
) -> RepairTask:
    """The task whose reference is `lines` and whose bug replaces line `i` by `mutated`, with
    seeded inputs: the visible one where bug and fix differ, and `n_hidden` hidden ones."""
    fixed = "\n".join(lines) + "\n"
    buggy = "\n".join(lines[:i] + [mutated] + lines[i + 1 :]) + "\n"
    pool = [_inputs(arity, rng) for _ in range(24)]
    differ = [a for a in pool if run_reference(buggy, a) != run_reference(fixed, a)]
    visible = differ[0] if differ else pool[0]
    hidden_inputs = [a for a in dict.fromkeys(pool) if a != visible][:n_hidden]
    return RepairTask(
        shape=shape,
        family=family,
        buggy=buggy,
        fixed=fixed,
        line=i + 1,
        fix_text=lines[i],
        visible=visible,
        visible_want=run_reference(fixed, visible),
        hidden=tuple((a, run_reference(fixed, a)) for a in hidden_inputs),
    )


def candidates(pairs: list[tuple[str, str]], key: str):
    """An endless seeded stream of candidate tasks over the (shape, family) `pairs` (draws of a
    pair without a site skipped); `key` separates the streams of the splits."""
    if not any(generate(s, f, 0) for s, f in pairs):
        raise ValueError(f"no bug family has a site in any shape of {pairs}")
    rng = random.Random(f"code_repair:stream:{key}")
    n = 0
    while True:
        shape, family = rng.choice(pairs)
        task = generate(shape, family, f"{key}:{n}")
        n += 1
        if task is not None:
            yield task
