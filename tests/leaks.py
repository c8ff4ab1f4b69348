"""What a test module leaves running: threads and child processes started during the module that
are still alive after it. conftest.py fails the module's last test on them (TESTING.md), so that a
thread not joined, an executor not shut down or a sandbox process not reaped shows where it began,
instead of as a suite that takes minutes to exit or a later test that sees an idle machine busy."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PROC = Path("/proc")
LIFELONG_THREADS = {"TMonitor"}  # tqdm.std.TMonitor, one per process while bars are open


def live_threads() -> set[threading.Thread]:
    """The threads alive now, less those a library starts once and keeps for the whole process on
    purpose (tqdm's monitor): not a leak of the module that happened to start them."""
    return {t for t in threading.enumerate() if t.is_alive() and type(t).__name__ not in LIFELONG_THREADS}


def descendants(pid: int | None = None) -> dict[int, str]:
    """Every process below `pid` (this one by default) as {pid: "name (state)"}, read from
    /proc/<pid>/stat; empty where there is no /proc (the check is Linux-only)."""
    if not PROC.is_dir():
        return {}
    pid = os.getpid() if pid is None else pid
    parent, label = {}, {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone between the listing and the read
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        parent[int(entry.name)], label[int(entry.name)] = int(rest[1]), f"{name} ({rest[0]})"
    found, frontier = {}, [pid]
    while frontier:
        p = frontier.pop()
        for child, up in parent.items():
            if up == p and child not in found:
                found[child] = label[child]
                frontier.append(child)
    return found


def long_lived_helpers() -> set[int]:
    """Processes the standard library starts once and keeps for the whole interpreter on purpose
    (multiprocessing's resource tracker and fork server): not a leak of the module that first used them."""
    pids = set()
    try:
        from multiprocessing import forkserver, resource_tracker

        pids.add(getattr(resource_tracker._resource_tracker, "_pid", None))
        pids.add(getattr(forkserver._forkserver, "_forkserver_pid", None))
    except ImportError:
        pass
    return {p for p in pids if p}


def left_running(threads_before: set, processes_before: set[int], grace: float = 5.0) -> list[str]:
    """Threads and processes started since the snapshot and still alive after `grace` seconds (time
    for a thread that was told to stop to finish, or a killed child to be reaped). Daemon threads
    count too: one abandoned by a time limit (the hub probe, a hung user call) must still end within
    its test, or it runs on in a later test that counts them (guard.user_threads) or sees its fakes."""
    deadline = time.monotonic() + grace
    while True:
        threads = list(live_threads() - threads_before)
        helpers = long_lived_helpers()
        processes = {p: s for p, s in descendants().items() if p not in processes_before and p not in helpers}
        if not (threads or processes) or time.monotonic() > deadline:
            break
        for t in threads:
            t.join(timeout=0.1)
        time.sleep(0.05)
    return [
        f"{'daemon ' if t.daemon else ''}thread {t.name!r} (target {getattr(t, '_target', None)!r})"
        for t in threads
    ] + [f"process {pid} {state}" for pid, state in sorted(processes.items())]
