"""Generated multi-file Python repositories with one seeded bug, for the shell environment.

A repository is a small package, its pytest tests, a README and a pytest.ini (kept tiny for a
1M-parameter, byte-level policy; the `trio` shape):

    calc/util.py                        calc/ops.py
    1 def step(n):  # n + 2             1 from calc.util import step
    2     return n + 2                  2 def up(a):  # step(a) * 3
                                        3     return step(a) * 3
    calc/stats.py                       tests/test_ops.py
    1 from calc.util import step        1 from calc.ops import up
    2 def pair(a, b):  # step(a) - b    2 def test_up():
    3     return step(a) - b            3     assert up(4) == 18

Each function's comment is its specification (what the hidden tests check), so a fix is readable
from the files: a repair rewrites the buggy line to match its comment. `step` is a helper used by
every other module: a bug there breaks the tests of two modules at once.

Shapes:
- pair:   util.step + ops.up (`return step(a) OP M`)
- branch: util.step + ops.up with an edge (`if a CMP L: return step(a) OP M` / `return a`)
- trio:   pair + stats.pair (`return step(a) OP b`), a second module using the helper

Bug families (one rewritten line in one file):
- helper_off_by_one: the helper's constant moved by one (`n + 2` -> `n + 3`): every module fails;
- op_swap: an operator of a module's function replaced (`* 3` -> `+ 3`);
- wrong_import: a module imports a misspelt name from the helper (`import stpe`): collection fails;
- edge_case: the branch's comparison moved across its edge (`a > L` -> `a >= L`); branch only.
A family with no site in a shape (edge_case in pair) cannot make a bug there: the generator draws
another pair. Expected outputs come from running the reference sources, this module's own
template text (trusted); what the agent touched runs only in the sandbox.

The hidden tests (calls and expected reprs) stay with the environment; the visible tests (one
assert per test function, on an input where the bug and the fix differ where one exists) are in
the workspace, and pytest.ini makes pytest's report short (`-q --tb=no -rfE`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from temper.tasks.base import Problem

PACKAGE = "calc"
SHAPES = ("pair", "branch", "trio")
FAMILIES = ("helper_off_by_one", "op_swap", "wrong_import", "edge_case")
PYTEST_INI = "[pytest]\npythonpath = .\naddopts = -q --tb=no -rfE -p no:cacheprovider -o console_output_style=classic\n"
README = "# calc\nA tiny package. Run the tests with `pytest`.\n"
PROTECTED = ("pytest.ini",)
"""Starting files besides tests/ whose change breaks the rules (test_edited)."""

_OPS = ("+", "-", "*")
_CMPS = (">", ">=", "<", "<=")
_TYPOS = ("stp", "stpe", "steps", "sterp")


@dataclass(frozen=True)
class RepoTask:
    """One generated repository. `buggy` / `fixed`: every file's text (path -> text); `bug_file`,
    `line` (1-based) and `fix_text`: where the bug is and the reference line; `hidden`: calls
    (module, function, args) and the repr each must return."""

    shape: str
    family: str
    buggy: dict[str, str]
    fixed: dict[str, str]
    bug_file: str
    line: int
    fix_text: str
    hidden: tuple[tuple[str, str, tuple[int, ...], str], ...]

    @property
    def key(self) -> str:
        """What makes two tasks the same (admission's duplicate check)."""
        return "\0".join(f"{p}\0{t}" for p, t in sorted(self.buggy.items()))

    @property
    def bug_line(self) -> str:
        return self.buggy[self.bug_file].split("\n")[self.line - 1]

    def files(self) -> dict[str, str]:
        """The workspace at the start of an episode."""
        return dict(self.buggy)

    def sources(self, files: dict[str, str]) -> dict[str, str]:
        """The package's modules of `files` (what the oracle takes)."""
        return {p: t for p, t in files.items() if p.startswith(f"{PACKAGE}/") and p.endswith(".py")}


def task_of(problem: Problem) -> RepoTask:
    """The task a problem holds (its data is the task's fields, `asdict(task)`)."""
    d = problem.data
    return RepoTask(
        shape=d["shape"],
        family=d["family"],
        buggy=dict(d["buggy"]),
        fixed=dict(d["fixed"]),
        bug_file=d["bug_file"],
        line=d["line"],
        fix_text=d["fix_text"],
        hidden=tuple((m, f, tuple(a), w) for m, f, a, w in d["hidden"]),
    )


def _modules(shape: str, rng: random.Random) -> tuple[dict[str, list[str]], dict[str, tuple[str, int]]]:
    """The reference modules of `shape` (path -> lines) and each public function's (module path,
    arity), with drawn operators and constants."""
    k, m = rng.randint(1, 4), rng.randint(2, 5)
    hop, op = rng.choice(("+", "*")), rng.choice(_OPS)
    util = [f"def step(n):  # n {hop} {k}", f"    return n {hop} {k}"]
    if shape == "branch":
        c, lim = rng.choice(_CMPS), rng.randint(2, 6)
        ops = [
            "from calc.util import step",
            f"def up(a):  # step(a) {op} {m} if a {c} {lim} else a",
            f"    if a {c} {lim}:",
            f"        return step(a) {op} {m}",
            "    return a",
        ]
    else:
        ops = [
            "from calc.util import step",
            f"def up(a):  # step(a) {op} {m}",
            f"    return step(a) {op} {m}",
        ]
    modules = {"calc/util.py": util, "calc/ops.py": ops}
    functions = {"step": ("calc/util.py", 1), "up": ("calc/ops.py", 1)}
    if shape == "trio":
        o2 = rng.choice(_OPS)
        modules["calc/stats.py"] = [
            "from calc.util import step",
            f"def pair(a, b):  # step(a) {o2} b",
            f"    return step(a) {o2} b",
        ]
        functions["pair"] = ("calc/stats.py", 2)
    elif shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; valid shapes: {', '.join(SHAPES)}")
    return modules, functions


def _bug(family: str, modules: dict[str, list[str]], rng: random.Random) -> tuple[str, int, str] | None:
    """(path, 0-based line, buggy text) of one drawn bug of `family`, or None without a site."""
    if family == "helper_off_by_one":
        head, k = modules["calc/util.py"][1].rsplit(" ", 1)
        return "calc/util.py", 1, f"{head} {int(k) + rng.choice((-1, 1))}"
    users = [p for p in modules if p != "calc/util.py"]
    path = rng.choice(users)
    lines = modules[path]
    if family == "wrong_import":
        return path, 0, f"from calc.util import {rng.choice(_TYPOS)}"
    if family == "op_swap":
        i = len(lines) - 1 if not lines[-1].strip().startswith("return a") else len(lines) - 2
        head, op, tail = lines[i].rsplit(" ", 2)
        return path, i, f"{head} {rng.choice([o for o in _OPS if o != op])} {tail}"
    if family == "edge_case":
        i = next((j for j, t in enumerate(lines) if t.strip().startswith("if ")), None)
        if i is None:
            return None
        edge = {">": ">=", ">=": ">", "<": "<=", "<=": "<"}
        words = lines[i].split(" ")
        j = next(j for j, w in enumerate(words) if w in edge)
        words[j] = edge[words[j]]
        return path, i, " ".join(words)
    raise ValueError(f"unknown bug family {family!r}; valid families: {', '.join(FAMILIES)}")


def _tests(modules: dict[str, list[str]], functions: dict[str, tuple[str, int]], args: dict) -> dict:
    """The visible test files: one per module using the helper, one assert each."""
    out = {}
    for name, (path, _) in functions.items():
        if path == "calc/util.py":
            continue
        mod = path.split("/")[1][:-3]
        a = args[name]
        want = call_reference(modules, path, name, a)
        out[f"tests/test_{mod}.py"] = (
            f"from calc.{mod} import {name}\ndef test_{name}():\n"
            f"    assert {name}({', '.join(map(str, a))}) == {want}\n"
        )
    return out


def call_reference(modules: dict[str, list[str]], path: str, name: str, args: tuple) -> str | None:
    """repr(name(*args)) of the generator's own sources (trusted template text), None on a raise.
    The package is executed module by module in one namespace: util first, then the users (the
    import line is dropped: `step` is already there)."""
    scope: dict = {}
    try:
        for p in ("calc/util.py", path):
            lines = [ln for ln in modules[p] if not ln.startswith("from calc.")]
            exec(compile("\n".join(lines) + "\n", p, "exec"), scope)  # noqa: S102 - our own templates
        return repr(scope[name](*args))
    except Exception:
        return None


def build(shape: str, family: str, rng: random.Random, n_hidden: int = 6) -> RepoTask | None:
    """One task of (shape, family) from `rng`; None when the family has no site in the shape or no
    visible input shows the bug."""
    modules, functions = _modules(shape, rng)
    bug = _bug(family, modules, rng)
    if bug is None:
        return None
    path, i, text = bug
    buggy_modules = {p: list(ls) for p, ls in modules.items()}
    buggy_modules[path][i] = text

    def draw_args(name: str) -> tuple[int, ...]:
        return tuple(rng.randint(0, 9) for _ in range(functions[name][1]))

    visible = {}
    for name, (p, _) in functions.items():  # an input on which the bug shows, when one exists
        if p == "calc/util.py":
            continue
        tries = [draw_args(name) for _ in range(20)]
        if family == "edge_case":  # the edge itself
            lim = int(modules["calc/ops.py"][2].split(" ")[-1].rstrip(":"))
            tries.insert(0, (lim,))
        shows = [
            a
            for a in tries
            if call_reference(buggy_modules, p, name, a) != call_reference(modules, p, name, a)
        ]
        visible[name] = shows[0] if shows else tries[0]
    hidden = []
    names = [n for n in functions if n != "step"]
    for j in range(n_hidden):
        name = names[j % len(names)]
        a = draw_args(name) if j >= len(names) else visible[name]
        hidden.append(
            (functions[name][0][5:-3], name, a, call_reference(modules, functions[name][0], name, a))
        )
    tests = _tests(modules, functions, visible)
    common = {"README.md": README, "pytest.ini": PYTEST_INI, "calc/__init__.py": "", **tests}

    def files(mods: dict[str, list[str]]) -> dict[str, str]:
        return {**common, **{p: "\n".join(ls) + "\n" for p, ls in mods.items()}}

    return RepoTask(
        shape=shape,
        family=family,
        buggy=files(buggy_modules),
        fixed=files(modules),
        bug_file=path,
        line=i + 1,
        fix_text=modules[path][i],
        hidden=tuple(hidden),
    )


def candidates(pairs: list[tuple[str, str]], key: str, n_hidden: int = 6):
    """An endless seeded stream of candidate tasks over the (shape, family) pairs."""
    rng = random.Random(f"shell_repo:{key}")
    while True:
        shape, family = rng.choice(pairs)
        task = build(shape, family, rng, n_hidden)
        if task is not None:
            yield task
