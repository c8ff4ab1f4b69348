"""The oracle: hidden tests run on the agent's `sol.py` in a fresh sandbox the workspace cannot touch.

Why not pytest in the episode's workspace: everything there is the agent's. A planted `pytest.py`,
`conftest.py`, `unittest.py` or `sitecustomize.py` would be imported by a runner that puts the
workspace on its path, and code in sol.py itself runs inside the test process, where it can exit(0)
at import, print "PASSED", override `__eq__` so every `==` holds, or patch builtins. So:

- only the text of sol.py leaves the episode (read without following a symlink, size-capped) and is
  written into a NEW empty sandbox workspace; nothing else of the episode is there;
- the runner is passed as `python -I -S -c CODE` (isolated mode: no PYTHON* variables, no user
  site, no script directory on sys.path; -S: no `site`, hence no sitecustomize) and loads sol.py
  by file path, never through sys.path;
- the runner reports only `repr(f(*args))` for each hidden input, on a line marked with a fresh
  random nonce; the expected outputs never enter the sandbox. Pass/fail is decided HERE, by
  comparing those strings with the expected reprs: `__eq__` is never called, an exit(0) or a
  "PASSED" yields no result line (a fail), and code that steals the nonce from the runner's frame
  can still only print values it computed — forging a pass means computing the right outputs,
  which is the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from temper.envs.code_repair.generator import SOLUTION

MAX_SOURCE_BYTES = 16_384

_RUNNER = """\
import importlib.util, json, os, sys
NONCE = {nonce!r}
CASES = {cases!r}
out = []
try:
    spec = importlib.util.spec_from_file_location("sol", os.path.join(os.getcwd(), "sol.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for args in CASES:
        try:
            out.append(repr(mod.f(*args)))
        except Exception as e:
            out.append("error " + type(e).__name__)
except BaseException as e:
    out = ["import error " + type(e).__name__] * len(CASES)
sys.stdout.write("\\n" + NONCE + json.dumps(out) + "\\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class Verdict:
    """passed: every hidden test matched; n_passed of n_tests; reason: "pass", "fail", "no_result"
    (the runner reported nothing: an exit at import, a crash, a timeout) or "no_solution"."""

    passed: bool
    n_passed: int
    n_tests: int
    reason: str
    output: str = ""
    """The run's stdout (its last 2000 characters), for diagnosis; never part of the decision."""


def read_regular(path: Path, limit: int = MAX_SOURCE_BYTES) -> str | None:
    """The text of `path` if it is a regular file (a symlink the sandboxed code planted is not
    followed: this runs on the host), cut at `limit` bytes; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def run_hidden(source: str, hidden, *, timeout_s: float = 5.0, unsafe: bool = False) -> Verdict:
    """Run the hidden tests `hidden` ((args, expected) pairs) on the sol.py text `source` in a
    fresh sandbox (module docstring)."""
    from temper.sandbox import Limits, Sandbox, workspace_root  # probes the host: only when used
    from temper.sandbox.sandbox import default_python

    nonce = secrets.token_hex(16)
    cases = [list(args) for args, _ in hidden]
    # the file is written before the Sandbox is made, which hands the workspace to its uid
    workspace = Path(tempfile.mkdtemp(prefix="oracle-", dir=workspace_root()))
    try:
        (workspace / SOLUTION).write_text(source)
        sandbox = Sandbox(workspace, Limits(wall_s=timeout_s, output_bytes=1 << 16), unsafe=unsafe)
        try:
            result = sandbox.run_cmd(oracle_argv(default_python(), nonce, cases))
        finally:
            sandbox.close()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    verdict = judge(result.stdout, nonce, [want for _, want in hidden], timed_out=result.timed_out)
    return dataclasses.replace(verdict, output=result.stdout[-2000:])


def oracle_argv(python: str, nonce: str, cases: list[list[int]]) -> list[str]:
    """The oracle's command line: isolated mode (-I: no PYTHON* variables, no user site, no
    script or working directory on sys.path), no `site` (-S: no sitecustomize), the runner as code."""
    return [python, "-I", "-S", "-B", "-c", _RUNNER.format(nonce=nonce, cases=cases)]


def judge(stdout: str, nonce: str, wants: list, *, timed_out: bool = False) -> Verdict:
    """Compare the runner's last nonce-marked result line with the expected reprs (host side)."""
    n = len(wants)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(nonce)]
    if timed_out or not lines:
        return Verdict(False, 0, n, "no_result")
    try:
        got = json.loads(lines[-1][len(nonce) :])
    except json.JSONDecodeError:
        return Verdict(False, 0, n, "no_result")
    if not isinstance(got, list) or len(got) != n or not all(isinstance(g, str) for g in got):
        return Verdict(False, 0, n, "no_result")
    ok = sum(g == repr(w) for g, w in zip(got, wants, strict=True))
    return Verdict(ok == n, ok, n, "pass" if ok == n else "fail")


def grade_workspace(workspace: Path, hidden, **kw) -> Verdict:
    """The hidden tests on the workspace's sol.py (only that file's text is taken)."""
    source = read_regular(workspace / SOLUTION)
    if source is None:
        return Verdict(False, 0, len(hidden), "no_solution")
    return run_hidden(source, hidden, **kw)
