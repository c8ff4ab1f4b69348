"""The fail-to-pass gate: a generated task enters a pool only if the sandbox confirms it.

A candidate (generator.py) is admitted when, each run in the sandbox:
- its hidden tests FAIL on the buggy sol.py and PASS on the reference fix (the oracle of grader.py),
- its visible test FAILS on the buggy code (the failure the agent must reproduce with run_tests)
  and PASSES on the fix (visible.py's `run_tests`, in a workspace holding the two files).

Rejections are counted by the first reason that applies, in this order:
- duplicate: the same buggy source was already admitted (to this or an earlier split, so the
  splits never share a task);
- passes_on_bug: the hidden tests do not catch the bug (an equivalent mutant for these inputs);
- error: the buggy code gave the oracle no result (a crash at import, a timeout): not a test
  failure the repair can be checked against;
- fails_on_fix: the hidden tests fail on the reference fix (a generator bug; expected 0);
- visible_passes_on_bug / visible_fails_on_fix: the visible test cannot show the bug, or fails on
  the fix.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.envs.code_repair.generator import SOLUTION, TESTS, RepairTask
from temper.envs.code_repair.grader import run_hidden
from temper.envs.code_repair.visible import run_visible

REASONS = (
    "duplicate",
    "passes_on_bug",
    "error",
    "fails_on_fix",
    "visible_passes_on_bug",
    "visible_fails_on_fix",
)


@dataclass
class Admission:
    """An admitted pool and the counts of its candidates: `counts["admitted"]` and one entry per
    rejection reason (all of REASONS present, zeros included)."""

    tasks: list[RepairTask] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def check(task: RepairTask, *, unsafe: bool = False) -> str | None:
    """The reason `task` is rejected (not counting duplicates), or None when it is admitted."""
    on_bug = run_hidden(task.buggy, task.hidden, unsafe=unsafe)
    if on_bug.passed:
        return "passes_on_bug"
    if on_bug.reason == "no_result":
        return "error"
    if not run_hidden(task.fixed, task.hidden, unsafe=unsafe).passed:
        return "fails_on_fix"
    if visible_result(task.buggy, task.test_source, unsafe=unsafe).startswith("PASS"):
        return "visible_passes_on_bug"
    if visible_result(task.fixed, task.test_source, unsafe=unsafe) != "PASS":
        return "visible_fails_on_fix"
    return None


def visible_result(solution: str, tests: str, *, unsafe: bool = False) -> str:
    """`run_tests` on a workspace of these two files (a fresh sandbox)."""
    from temper.sandbox import Limits, Sandbox, workspace_root

    workspace = Path(tempfile.mkdtemp(prefix="admit-", dir=workspace_root()))
    try:
        (workspace / SOLUTION).write_text(solution)
        (workspace / TESTS).write_text(tests)
        sandbox = Sandbox(workspace, Limits(wall_s=5.0, output_bytes=4096), unsafe=unsafe)
        try:
            return run_visible(sandbox)
        finally:
            sandbox.close()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def admit(
    candidates: Iterable[RepairTask],
    n: int,
    *,
    seen: set[str] | None = None,
    max_candidates: int = 0,
    workers: int = 4,
    unsafe: bool = False,
    checker: Callable[..., str | None] | None = None,
    key: Callable[[Any], str] = lambda t: t.buggy,
) -> Admission:
    """The first `n` admitted tasks of the `candidates` stream (in stream order, so the pool is a
    pure function of the stream whatever the thread timing), looking at no more than
    `max_candidates` (0: 4n + 20). `seen` (buggy sources of earlier pools) is updated in place.
    Candidates are checked `workers` at a time: each check is a few sandbox runs, mostly waiting.
    `checker(task, unsafe=)` and `key(task)` (what makes two tasks duplicates) default to this
    module's (code_repair's); the shell environment passes its own."""
    checker = checker or check
    seen = set() if seen is None else seen
    limit = max_candidates or 4 * n + 20
    counts: Counter = Counter({r: 0 for r in REASONS})
    out = Admission()
    stream = iter(candidates)
    looked = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while len(out.tasks) < n and looked < limit:
            batch = []
            for task in stream:
                looked += 1
                if key(task) in seen or key(task) in {key(t) for t in batch}:
                    counts["duplicate"] += 1
                else:
                    batch.append(task)
                if len(batch) >= min(workers, n - len(out.tasks)) or looked >= limit:
                    break
            if not batch:
                break
            for task, reason in zip(batch, pool.map(lambda t: checker(t, unsafe=unsafe), batch), strict=True):
                if reason is not None:
                    counts[reason] += 1
                elif len(out.tasks) < n:
                    out.tasks.append(task)
                    seen.add(key(task))
    counts["admitted"] = len(out.tasks)
    out.counts = dict(counts)
    return out
