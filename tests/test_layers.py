"""The layer order of ARCHITECTURE.md, enforced: no module imports from a layer above its own, no
two modules import each other (directly or round a circle), and no module imports another's
`_private` name. Every `import` counts, function-local ones and `importlib.import_module("temper...")`
strings included; only `if TYPE_CHECKING:` blocks are left out (annotations, never run).

Also item 4 of the stage contract: outside `temper.stages` no code compares a stage's kind with a
registered kind name (`stage.kind == "eval"`); what differs between kinds is a `StageKind` hook."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "cross-cutting",
        (
            "temper",
            "temper.atomic",
            "temper.distributed",
            "temper.guard",
            "temper.jsonl",
            "temper.labels",
            "temper.lazy",
            "temper.precision",
            "temper.stats",
        ),
    ),
    ("data", ("temper.data",)),
    ("tasks", ("temper.tasks",)),
    ("models", ("temper.models",)),
    ("samplers", ("temper.rollout",)),
    ("tools / sandbox", ("temper.tools", "temper.sandbox", "temper.gateway")),
    ("envs", ("temper.envs",)),
    ("catalog", ("temper.catalog",)),
    ("export", ("temper.export",)),
    (
        "episodes",
        (
            "temper.rollout.loop",
            "temper.rollout.env_workers",
            "temper.rollout.trajectory",
            "temper.gateway.recording",
            "temper.gateway.serving",
        ),
    ),
    ("rewards", ("temper.rewards",)),
    ("algorithms", ("temper.algorithms",)),
    ("train / evaluate", ("temper.train", "temper.evaluate", "temper.harness")),
    ("stages", ("temper.stages",)),
    ("report", ("temper.report",)),
    (
        "recipe / preflight / runner / cli",
        ("temper.recipe", "temper.preflight", "temper.runner", "temper.cli"),
    ),
    ("api", ("temper.api",)),
]
"""Bottom first; a module belongs to the layer of its longest listed prefix (so rollout's samplers
sit below the envs, which may hold one, and its episode loop above them, which it drives)."""

PURE = ("temper.algorithms",)
"""Packages that import nothing of temper beyond themselves and the cross-cutting modules."""


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (the longest temper module the import names)
    names: tuple[str, ...]  # names taken from the target (`from target import a, b`)
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} -> {self.target}"


def modules(root: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _longest(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def edges(root: Path = SRC) -> list[Edge]:
    """Every import of a temper module by a temper module, at any depth of the file."""
    known = modules(root)
    return [e for module, path in known.items() for e in _file_edges(module, path, known, root)]


def _file_edges(module: str, path: Path, known: dict[str, Path], root: Path) -> list[Edge]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    rel = path.relative_to(root.parent)
    found: list[Edge] = []

    def add(target: str, names: tuple[str, ...], line: int) -> None:
        resolved = _longest(target, known)
        if resolved is not None and resolved.split(".")[0] == "temper":
            found.append(Edge(module, resolved, names, f"{rel}:{line}"))

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for stmt in child.orelse:
                    visit(stmt)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, (), child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:  # `from package import submodule`
                        add(sub, (), child.lineno)
                    else:
                        add(base, (alias.name,), child.lineno)
            elif isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                arg = child.args[0] if child.args else None
                if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                    add(str(arg.value), (), child.lineno)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                if re.fullmatch(r"temper(\.\w+)+:\w+", child.value):  # a "module:attr" import string
                    add(child.value.partition(":")[0], (), child.lineno)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def layer_of(module: str) -> int:
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    if index is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to ARCHITECTURE.md)")
    return index


FACADE = ("temper", "temper.api")
"""The one import up the layers: the package's `__getattr__` lends the Python API's names
(`temper.sft`...), importing `temper.api` on first use, so `import temper` stays cheap and imports
nothing above it. Only inside that function (checked by `test_the_facade_is_lazy`)."""


def upward(found: list[Edge]) -> list[str]:
    out = []
    for e in found:
        if (e.source, e.target) == FACADE:
            continue
        a, b = layer_of(e.source), layer_of(e.target)
        if b > a:
            out.append(f"{e} runs up from {LAYERS[a][0]} to {LAYERS[b][0]}")
        elif any(e.source.startswith(p) for p in PURE) and b != 0 and b != a:
            out.append(f"{e}: {LAYERS[a][0]} are pure and import only the cross-cutting modules")
    return out


def cycles(found: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for e in found:
        if e.source != e.target:
            graph.setdefault(e.source, set()).add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def private_imports(found: list[Edge]) -> list[str]:
    return [
        f"{e} imports {n!r}, a private name of another module: make it public (with a docstring) or move it"
        for e in found
        if e.source != e.target
        for n in e.names
        if n.startswith("_") and not n.startswith("__")
    ]


def kind_comparisons(root: Path = SRC) -> list[str]:
    """`... kind == "<a registered kind>"` (or `in (...)`) outside temper.stages, file:line each."""
    from temper.stages import registry

    names = set(registry.kinds())

    def constants(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {c.value for c in node.elts if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        return set()

    def mentions_kind(node: ast.AST) -> bool:
        return any(
            (isinstance(n, ast.Name) and "kind" in n.id)
            or (isinstance(n, ast.Attribute) and "kind" in n.attr)
            for n in ast.walk(node)
        )

    out = []
    for module, path in modules(root).items():
        if module == "temper.stages" or module.startswith("temper.stages."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Compare)), key=lambda n: n.lineno):
            sides = [node.left, *node.comparators]
            hit = set().union(*(constants(s) for s in sides)) & names
            if hit and any(mentions_kind(s) for s in sides if not constants(s)):
                out.append(
                    f"{path.relative_to(root.parent)}:{node.lineno}: compares a kind with {sorted(hit)}"
                )
    return out


def test_every_module_is_in_a_layer():
    for module in modules():
        layer_of(module)


def test_no_import_runs_up_a_layer():
    found = upward(edges())
    assert not found, "\n".join(found)


def test_no_import_cycle():
    found = cycles(edges())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_a_private_name_of_another():
    found = private_imports(edges())
    assert not found, "\n".join(found)


def test_no_stage_kind_is_named_outside_the_stages():
    found = kind_comparisons()
    assert not found, "\n".join(found)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tiny source tree to show each check red: a task that imports the envs, function-locally
    and by an import string, a cycle inside data, a private import and a kind comparison."""
    files = {
        "temper/__init__.py": "",
        "temper/tasks/__init__.py": "",
        "temper/tasks/base.py": "def make():\n    from temper.envs.base import Env\n    return Env\n",
        "temper/tasks/names.py": "import importlib\nM = importlib.import_module('temper.envs.base')\n",
        "temper/envs/__init__.py": "",
        "temper/envs/base.py": (
            "from typing import TYPE_CHECKING\nfrom temper.tasks.base import make\n"
            "if TYPE_CHECKING:\n    from temper.cli import main\nclass Env: ...\n"
        ),
        "temper/data/__init__.py": "",
        "temper/data/a.py": "from temper.data.b import _helper\n",
        "temper/data/b.py": "from .a import *\ndef _helper(): ...\n",
        "temper/cli.py": "def f(stage):\n    return stage.kind in ('rl', 'eval') or stage.split == 'eval'\n",
    }
    for name, text in files.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_text(text)
    return tmp_path / "src"


def test_each_check_names_the_file_and_line_of_what_breaks_it(tree):
    found = edges(tree)
    assert upward(found) == [
        "src/temper/tasks/base.py:2: temper.tasks.base -> temper.envs.base runs up from tasks to envs",
        "src/temper/tasks/names.py:2: temper.tasks.names -> temper.envs.base runs up from tasks to envs",
    ]  # the TYPE_CHECKING import of the cli by the envs is not an edge
    assert cycles(found) == [["temper.data.a", "temper.data.b"], ["temper.envs.base", "temper.tasks.base"]]
    assert private_imports(found) == [
        "src/temper/data/a.py:1: temper.data.a -> temper.data.b imports '_helper', a private name of another "
        "module: make it public (with a docstring) or move it"
    ]
    assert kind_comparisons(tree) == ["src/temper/cli.py:2: compares a kind with ['eval', 'rl']"]


def test_the_facade_is_lazy():
    """`temper/__init__.py` imports `temper.api` only inside its module `__getattr__` (a top-level
    import there would load torch on `import temper`, and every module with it)."""
    tree = ast.parse((SRC / "temper" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            assert (node.module or "") not in ("temper", "temper.api"), (
                "temper/__init__.py imports at import time"
            )
    lazy = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    assert lazy and any(isinstance(n, ast.ImportFrom) for n in ast.walk(lazy[0]))
