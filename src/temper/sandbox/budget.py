"""What one sandbox may take of this host: `Limits` fitted to MemTotal and to the free disk.

Shares of the host, per sandbox (N sandboxes at once can take N times these):

- memory: `memory_mb` is at most MEMORY_SHARE of MemTotal. Where a memory cgroup holds the sandbox,
  that is its whole footprint (its processes, and the pages it writes to its tmpfs /tmp, /dev/shm
  and workspace, which the kernel charges to the writer's group). Without one, only RLIMIT_AS per
  process holds, so the product `procs x memory_mb` plus the in-memory filesystems is kept under the
  same share: `procs` is lowered first (down to MIN_PROCS; RLIMIT_NPROC counts threads too, so
  fewer than that breaks thread pools), then `memory_mb`.
- each in-memory filesystem (`tmp_mb` for /tmp and /dev/shm, `workspace_mb` where the workspace is
  a tmpfs): at most RAMDISK_SHARE of MemTotal.
- a directory on disk (`workspace_mb` where the workspace is not a tmpfs, tier B's tmp dir): at most
  DISK_SHARE of its filesystem's free space when the Sandbox is made.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

MEMORY_SHARE = 0.5
RAMDISK_SHARE = 0.125
DISK_SHARE = 0.25
MIN_PROCS = 16

log = logging.getLogger("temper.sandbox")
_reported: set[tuple] = set()


def mem_total_mb() -> int:
    """MemTotal from /proc/meminfo, in MiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) >> 10
    raise OSError("no MemTotal in /proc/meminfo")


def free_disk_mb(path: Path) -> int:
    """Space an unprivileged writer can still use on path's filesystem, in MiB."""
    st = os.statvfs(path)
    return (st.f_bavail * st.f_frsize) >> 20


def memory_cap_mb() -> int:
    """The most memory one sandbox may hold in total."""
    return max(int(mem_total_mb() * MEMORY_SHARE), 1)


def ramdisk_cap_mb() -> int:
    """The largest in-memory filesystem one sandbox may have."""
    return max(int(mem_total_mb() * RAMDISK_SHARE), 1)


def fit(
    limits,
    *,
    memory_cgroup: bool,
    tmpfs_of_tmp: int,
    workspace_in_ram: bool,
    disk_dirs: dict[str, Path],
    total_mb: int | None = None,
):
    """`limits` lowered where they would exceed this host (module docstring). `tmpfs_of_tmp`: how
    many in-memory filesystems of `tmp_mb` a call has (tier A: /tmp and /dev/shm); `disk_dirs`:
    the capped fields whose directory is on disk ("workspace_mb", "tmp_mb") -> that directory."""
    total = mem_total_mb() if total_mb is None else total_mb
    ram_cap = max(int(total * RAMDISK_SHARE), 1)
    sizes = {"tmp_mb": limits.tmp_mb, "workspace_mb": limits.workspace_mb}
    for name in sizes:
        if name in disk_dirs:
            sizes[name] = min(sizes[name], max(int(free_disk_mb(disk_dirs[name]) * DISK_SHARE), 1))
        else:
            sizes[name] = min(sizes[name], ram_cap)
    memory_mb = min(limits.memory_mb, max(int(total * MEMORY_SHARE), 1))
    procs = limits.procs
    if not memory_cgroup:
        ramdisks = tmpfs_of_tmp * sizes["tmp_mb"] + (sizes["workspace_mb"] if workspace_in_ram else 0)
        budget = max(int(total * MEMORY_SHARE) - ramdisks, 1)
        if procs * memory_mb > budget:
            procs = max(min(procs, MIN_PROCS), budget // memory_mb)
        if procs * memory_mb > budget:
            memory_mb = max(budget // procs, 1)
    fitted = dataclasses.replace(limits, memory_mb=memory_mb, procs=procs, **sizes)
    if fitted != limits and (limits, fitted) not in _reported:
        _reported.add((limits, fitted))
        changed = ", ".join(
            f"{f.name} {getattr(limits, f.name)} -> {getattr(fitted, f.name)}"
            for f in dataclasses.fields(limits)
            if getattr(limits, f.name) != getattr(fitted, f.name)
        )
        why = "memory cgroup" if memory_cgroup else "no memory cgroup: procs x memory_mb bounded"
        log.info("sandbox limits fitted to this host (MemTotal %d MiB, %s): %s", total, why, changed)
    return fitted
