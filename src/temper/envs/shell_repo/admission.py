"""The fail-to-pass gate of the shell environment: a generated repository enters a pool only if
the sandbox confirms, in this order (the first failing check is the rejection's reason):

- passes_on_bug: the hidden tests do not catch the bug (an equivalent mutant for these inputs);
- fails_on_fix: the hidden tests fail on the reference fix (a generator bug; expected 0);
- visible_passes_on_bug: `pytest` in a workspace holding the buggy repository exits 0 (the agent
  could not reproduce the failure);
- visible_fails_on_fix: `pytest` on the fixed repository does not exit 0.
`duplicate` (the same buggy repository admitted already, to this or an earlier split) is counted
by the shared loop (temper.envs.code_repair.admission.admit), which this reuses with its own check.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from temper.envs.code_repair.admission import Admission, admit
from temper.envs.shell_repo.oracle import run_hidden
from temper.envs.shell_repo.repo import RepoTask
from temper.envs.shell_repo.tools import shell_argv, tools_dir
from temper.envs.shell_repo.workspace import write_tree

REASONS = ("duplicate", "passes_on_bug", "fails_on_fix", "visible_passes_on_bug", "visible_fails_on_fix")


def check(task: RepoTask, *, unsafe: bool = False) -> str | None:
    """The reason `task` is rejected (not counting duplicates), or None when it is admitted."""
    if run_hidden(task.sources(task.buggy), task.hidden, unsafe=unsafe).passed:
        return "passes_on_bug"
    if not run_hidden(task.sources(task.fixed), task.hidden, unsafe=unsafe).passed:
        return "fails_on_fix"
    if pytest_exit(task.buggy, unsafe=unsafe) == 0:
        return "visible_passes_on_bug"
    if pytest_exit(task.fixed, unsafe=unsafe) != 0:
        return "visible_fails_on_fix"
    return None


def pytest_exit(files: dict[str, str], *, unsafe: bool = False) -> int | None:
    """The exit code of `pytest` in a fresh sandbox workspace holding `files`."""
    from temper.sandbox import Limits, Sandbox, workspace_root

    tools = tools_dir()
    workspace = Path(tempfile.mkdtemp(prefix="shell-admit-", dir=workspace_root()))
    try:
        write_tree(workspace, files)
        sandbox = Sandbox(
            workspace, Limits(wall_s=10.0, output_bytes=4096), unsafe=unsafe, ro_binds=(str(tools),)
        )
        try:
            return sandbox.run_cmd(shell_argv("pytest", tools)).exit_code
        finally:
            sandbox.close()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def admit_repos(candidates: Iterable[RepoTask], n: int, *, seen: set[str], unsafe: bool = False) -> Admission:
    """The first `n` admitted repositories of the stream (see `admit`), rejections by REASONS."""
    out = admit(candidates, n, seen=seen, unsafe=unsafe, checker=check, key=lambda t: t.key)
    out.counts = {r: out.counts.get(r, 0) for r in (*REASONS, "admitted")}
    return out
