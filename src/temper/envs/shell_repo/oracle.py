"""The oracle of the shell environment: hidden tests on the agent's package, in a fresh sandbox.

The same defences as code_repair's oracle (temper.envs.code_repair.grader, whose judge this
reuses), for a package of several modules instead of one file:
- only the package's modules leave the episode: regular `calc/*.py` files read on the host without
  following a symlink at any depth (workspace.py), size- and count-capped, written into a NEW empty
  sandbox workspace. The tests, pytest.ini, a planted conftest.py or sitecustomize.py, anything
  outside calc/ never reach the oracle;
- the runner is `python -I -S -c CODE` (isolated mode, no site: no sitecustomize, no PYTHON*
  variables) with only the fresh workspace put on sys.path, and imports `calc.<module>`;
- the runner reports only `repr(f(*args))` per hidden call on a line marked with a fresh nonce; the
  expected reprs never enter the sandbox and pass/fail is decided here by string comparison: an
  exit(0) at import, a forged "passed", an `__eq__` that always holds decide nothing.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import tempfile
from pathlib import Path

from temper.envs.code_repair.grader import Verdict, judge
from temper.envs.shell_repo.workspace import write_tree

_RUNNER = """\
import importlib, json, os, sys
NONCE = {nonce!r}
CALLS = {calls!r}
sys.path.insert(0, os.getcwd())
out = []
for module, name, args in CALLS:
    try:
        f = getattr(importlib.import_module("calc." + module), name)
        out.append(repr(f(*args)))
    except BaseException as e:
        out.append("error " + type(e).__name__)
sys.stdout.write("\\n" + NONCE + json.dumps(out) + "\\n")
sys.stdout.flush()
"""


def run_hidden(sources: dict[str, str], hidden, *, timeout_s: float = 5.0, unsafe: bool = False) -> Verdict:
    """The hidden calls `hidden` ((module, function, args, expected repr)) on the package modules
    `sources` (path -> text, paths under calc/) in a fresh sandbox (module docstring)."""
    from temper.sandbox import Limits, Sandbox, workspace_root
    from temper.sandbox.sandbox import default_python

    if not sources:
        return Verdict(False, 0, len(hidden), "no_solution")
    nonce = secrets.token_hex(16)
    calls = [[m, f, list(a)] for m, f, a, _ in hidden]
    workspace = Path(tempfile.mkdtemp(prefix="shell-oracle-", dir=workspace_root()))
    try:
        write_tree(workspace, {p: t for p, t in sources.items() if _module_path(p)})
        sandbox = Sandbox(workspace, Limits(wall_s=timeout_s, output_bytes=1 << 16), unsafe=unsafe)
        try:
            code = _RUNNER.format(nonce=nonce, calls=calls)
            result = sandbox.run_cmd([default_python(), "-I", "-S", "-B", "-c", code])
        finally:
            sandbox.close()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    # judge compares with repr(want): the expected values are reprs already, so compare to them
    verdict = judge(result.stdout, nonce, [_Repr(w) for *_, w in hidden], timed_out=result.timed_out)
    return dataclasses.replace(verdict, output=result.stdout[-2000:])


def _module_path(path: str) -> bool:
    """A path the oracle writes: `calc/NAME.py` with a plain name (one level, no dot-dirs)."""
    parts = path.split("/")
    return len(parts) == 2 and parts[0] == "calc" and parts[1].endswith(".py") and "." not in parts[1][:-3]


class _Repr(str):
    """An expected value already in repr form: `repr()` of it is itself (for `judge`)."""

    def __repr__(self) -> str:
        return str(self)
