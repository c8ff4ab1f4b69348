"""One Sandbox's cgroups: a total memory cap (and for tier B a process cap) on everything it runs.

RLIMIT_AS bounds one process, so without a group three children of 400 MB each pass a 512 MB limit.
A group per Sandbox, made once and reused by every call (a group per call costs 10-30 ms, research
note pitfall 6), holds the whole tree and the pages it writes to its tmpfs filesystems.

Where the host allows it, in this order:
- cgroup v2 (one unified group: `memory.max`, `memory.swap.max=0`, `pids.max`): below this process's
  own group when that group already hands the memory controller down (`cgroup.subtree_control`;
  only the root group can while holding processes), else beside it, below its parent. Controllers
  are never enabled here (that is the group owner's decision, systemd's on most hosts). Needs write
  access there: root, or a delegated subtree (systemd `Delegate=yes`).
- cgroup v1 (separate `memory` and `pids` hierarchies, e.g. this project's hybrid VMs): below this
  process's own groups; `memory.memsw.limit_in_bytes` too, so the cap is not dodged into swap.
  Writable only by root.
Otherwise no group: `budget.fit` keeps `procs x memory_mb` under the host instead, and every result
says so through `Sandbox.cgroups == []`.

Names carry the owner's pid (`temper-sbx-<pid>-<n>`) so a later Sandbox can remove the groups of an
owner that died without cleaning up (research note section 4).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_COUNTER = iter(range(1 << 62))


def _own_paths() -> dict[str, str]:
    """controller -> this process's group path, from /proc/self/cgroup ("" for the v2 line)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    own = {}
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            own[c] = path
    return own


def own_v1(controller: str) -> Path | None:
    """This process's directory in the v1 hierarchy of `controller`."""
    path = _own_paths().get(controller)
    if path is None:
        return None
    d = ROOT / controller / path.lstrip("/")
    return d if d.is_dir() else None


def _v2_mount() -> Path | None:
    for d in (ROOT, ROOT / "unified"):  # unified: v2 mounted beside the v1 hierarchies (hybrid)
        if (d / "cgroup.controllers").exists():
            return d
    return None


def _v2_parents() -> list[Path]:
    """Where a v2 group for the sandbox could go: this process's own group, then its parent."""
    mount, path = _v2_mount(), _own_paths().get("")
    if mount is None or path is None:
        return []
    own = mount / path.lstrip("/")
    return [own, own.parent] if own != mount else [own]


def _write(d: Path, name: str, value) -> None:
    (d / name).write_text(str(value))


def _make_v2(name: str, memory_bytes: int, pids: int | None) -> list[Path]:
    want = {"memory"} | ({"pids"} if pids is not None else set())
    for parent in _v2_parents():
        # only where the controllers are already handed down: enabling them is the group owner's
        # decision (systemd's, on most hosts), and a group holding processes cannot anyway
        try:
            if not want <= set((parent / "cgroup.subtree_control").read_text().split()):
                continue
        except OSError:
            continue
        _remove_stale(parent)
        d = parent / name
        try:
            d.mkdir()
        except OSError:
            continue
        try:
            _write(d, "memory.max", memory_bytes)
            if (d / "memory.swap.max").exists():
                _write(d, "memory.swap.max", 0)
            if pids is not None:
                _write(d, "pids.max", pids)
        except OSError:
            remove([d])
            continue
        return [d]
    return []


def _make_v1(name: str, memory_bytes: int, pids: int | None) -> list[Path]:
    settings = {
        "memory": [("memory.limit_in_bytes", memory_bytes), ("memory.memsw.limit_in_bytes", memory_bytes)]
    }
    if pids is not None:
        settings["pids"] = [("pids.max", pids)]
    made = []
    for ctrl, files in settings.items():
        own = own_v1(ctrl)
        if own is None:
            continue
        _remove_stale(own)
        d = own / name
        try:
            d.mkdir()
            for f, v in files:  # memsw only exists with swap accounting; it must be set after the limit
                if (d / f).exists():
                    _write(d, f, v)
        except OSError:
            remove([d])
            continue
        made.append(d)
    return made


def make(memory_mb: int, pids: int | None) -> list[Path]:
    """A fresh group (v2) or groups (v1 memory, pids) capping a tree at memory_mb in total and, when
    `pids` is given, at that many processes; [] where the host allows none (module docstring). On v1
    each controller is made where it can be, so a pids group may come without a memory one:
    `has_memory` says whether the total memory cap holds."""
    if os.geteuid() != 0 and _v2_mount() is None:
        return []  # v1 hierarchies are root's
    name = f"temper-sbx-{os.getpid()}-{next(_COUNTER)}"
    return _make_v2(name, memory_mb << 20, pids) or _make_v1(name, memory_mb << 20, pids)


def set_pids_max(groups: list[Path], n: int) -> None:
    for d in groups:
        if (d / "pids.max").exists():
            _write(d, "pids.max", n)


def has_memory(groups: list[Path]) -> bool:
    return any((d / "memory.max").exists() or (d / "memory.limit_in_bytes").exists() for d in groups)


def has_pids(groups: list[Path]) -> bool:
    return any((d / "pids.max").exists() for d in groups)


def attach(groups: list[Path], pid: int) -> None:
    """Move process `pid` into the groups (its later children are born in them)."""
    for d in groups:
        _write(d, "cgroup.procs", pid)


def pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill(groups: list[Path], limit_s: float = 5.0) -> int:
    """SIGKILL every process in the groups until they are empty; returns how many were found."""
    found = 0
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        live = [pid for d in groups for pid in pids(d)]
        if not live:
            break
        found += len(live)
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.002)
    return found


def oom_kills(groups: list[Path]) -> int:
    """How many processes the groups' memory cap has OOM-killed so far (v1 memory.oom_control and
    v2 memory.events both have an `oom_kill N` line)."""
    n = 0
    for d in groups:
        for f in ("memory.events", "memory.oom_control"):
            try:
                for line in (d / f).read_text().splitlines():
                    if line.startswith("oom_kill "):
                        n += int(line.split()[1])
            except (OSError, ValueError):
                continue
    return n


def remove(groups: list[Path]) -> None:
    # a v1 rmdir says EBUSY for a moment after its last process exits (research note pitfall 6)
    for d in groups:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _remove_stale(parent: Path) -> None:
    """Groups left by a temper process that died without cleaning up (a SIGKILLed trainer): their
    owner's pid is in the name; kill what is still in them and remove them."""
    for d in parent.glob("temper-sbx-*-*"):
        try:
            owner = int(d.name.split("-")[2])
            os.kill(owner, 0)
            continue  # its owner is alive (another trainer's sandbox): not ours to touch
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        kill([d], limit_s=1.0)
        remove([d])
