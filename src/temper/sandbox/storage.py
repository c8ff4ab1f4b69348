"""Total size caps on the sandbox's writable directories (its workspace, tier B's tmp dir).

RLIMIT_FSIZE caps one file, not how many: eight 60 MB files under a 64 MB limit reach the host disk.
Two mechanisms, the first where the host allows it:

- **A size-capped tmpfs** mounted on the directory for the Sandbox's life (`mount_tmpfs`): the kernel
  refuses the write that would pass `size=` (ENOSPC) and `nr_inodes=` caps the file count, with no
  cost per call. It needs CAP_SYS_ADMIN in the caller's mount namespace (a root caller outside a
  locked-down container). The files live in memory: pages the sandbox writes are charged to its
  memory cgroup, and `close()` unmounts it, so its files are gone after close. The mount's source
  names its owner's pid (`temper-sbx-<pid>`) so a later Sandbox unmounts those of a dead owner.
- **A quota check** otherwise (non-root callers; tier A's own /tmp and /dev/shm are always bwrap
  `--size` tmpfs): the Sandbox measures the directories' allocated size (`usage`) at the start of a
  call and every POLL_S while it runs, and kills the sandbox when they pass the cap
  (`killed_reason="disk_quota"`). It is not a hard cap: between two checks a writer can add what the
  disk takes in POLL_S (typically tens to hundreds of MB, page cache speed).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import tempfile
from pathlib import Path

POLL_S = 0.05
FILES_PER_MB = 256  # the inode cap of a tmpfs (and of the quota check): 64k files for 256 MB

MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _tag() -> str:
    return f"temper-sbx-{os.getpid()}"


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    ret = _libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
        data.encode() if data else None,
    )  # fmt: skip
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def unmount(path: Path) -> None:
    _libc.umount2(str(path).encode(), MNT_DETACH)


def mount_tmpfs(path: Path, size_mb: int, uid: int | None) -> bool:
    """Put `path`'s contents on a tmpfs of `size_mb` mounted on it (owner uid, the directory's mode);
    False, with path untouched, where this process may not mount. Regular files, directories and
    symlinks are moved in; anything else (fifos, sockets a previous sandbox left) is dropped."""
    st = path.lstat()
    opts = f"size={size_mb}m,nr_inodes={max(size_mb * FILES_PER_MB, 1024)},mode={stat.S_IMODE(st.st_mode):o}"
    opts += f",uid={st.st_uid if uid is None else uid},gid={st.st_gid if uid is None else uid}"
    stage = Path(tempfile.mkdtemp(prefix="temper-sbx-stage-"))
    try:
        _remove_stale_mounts()
        try:
            _mount(_tag(), str(stage), "tmpfs", MS_NOSUID | MS_NODEV, opts)
        except OSError:
            return False
        try:
            shutil.copytree(path, stage, symlinks=True, dirs_exist_ok=True, ignore=specials)
            for entry in os.scandir(path):  # the disk copy stays hidden under the mount: drop it
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            _mount(str(stage), str(path), None, MS_BIND, None)
        finally:
            unmount(stage)  # the bind on path keeps the tmpfs alive
        return True
    finally:
        os.rmdir(stage)


def specials(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: everything but regular files, directories and symlinks (opening a fifo to
    copy it would block)."""
    keep = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
    return [n for n in names if not any(k(os.lstat(os.path.join(directory, n)).st_mode) for k in keep)]


def _remove_stale_mounts() -> None:
    """Unmount the tmpfs filesystems of temper processes that died without closing their Sandbox."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        try:
            sep = fields.index("-")
            target, fstype, source = fields[4], fields[sep + 1], fields[sep + 2]
        except (ValueError, IndexError):
            continue
        if fstype != "tmpfs" or not source.startswith("temper-sbx-"):
            continue
        try:
            os.kill(int(source.rsplit("-", 1)[1]), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        unmount(Path(target.replace("\\040", " ")))


def usage(paths: list[Path], cap_bytes: int) -> tuple[int, int]:
    """(allocated bytes, entries) under paths, not following symlinks; the walk stops as soon as
    either passes its cap (bytes: cap_bytes; entries: FILES_PER_MB per MB of it), so a tree of a
    million empty files costs the check no more than its cap."""
    max_entries = max((cap_bytes >> 20) * FILES_PER_MB, 1024)
    total = entries = 0
    todo = [str(p) for p in paths]
    while todo:
        try:
            it = os.scandir(todo.pop())
        except OSError:  # removed meanwhile, or not readable
            continue
        with it:
            for e in it:
                entries += 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    todo.append(e.path)
                if total > cap_bytes or entries > max_entries:
                    return total, entries
    return total, entries


def over_cap(paths: list[Path], cap_mb: int) -> bool:
    total, entries = usage(paths, cap_mb << 20)
    return total > cap_mb << 20 or entries > max(cap_mb * FILES_PER_MB, 1024)
