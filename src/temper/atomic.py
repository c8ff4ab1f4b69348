"""Atomic writes: a crash never leaves a half-written file or directory behind.

What is written gets the user's umask like any other file (a scratch file from `tempfile` is
created 0600 and a scratch directory 0700, which would hide a model or a report from the other
users of a shared machine), and a write that fails because the disk is full says so and names
what it was writing (`torch.save` reports a full disk as "basic_ios::clear: iostream error").
Scratch names start with `.<name>.tmp-` (`.<name>.old-` for the copy being replaced), so
`remove_stale` can clear what a killed run left behind.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Below this many free bytes, a failed write is taken to be a full disk whatever it raised.
_NEARLY_FULL = 1 << 20
_SCRATCH = re.compile(r"^\..+\.(tmp|old)-[^/]+$")


class DiskFullError(OSError):
    """No space left on the device while writing `filename`."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOSPC, "no space left on the device", str(path))


def umask() -> int:
    """The process's umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _apply_umask(path: Path) -> None:
    """Give `path` (and everything under it) the modes a plain open/mkdir would have given."""
    mask = umask()
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if p.is_symlink():
            continue
        executable = p.is_dir() or p.stat().st_mode & 0o111
        os.chmod(p, (0o777 if executable else 0o666) & ~mask)


def _disk_full(err: BaseException, path: Path) -> BaseException:
    """`err` as a DiskFullError naming `path` when the disk is full, else `err` unchanged."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(err.filename or path)
    if isinstance(err, Exception) and not isinstance(err, OSError):
        try:  # e.g. torch.save's "iostream error", safetensors' "I/O error"
            if shutil.disk_usage(path.parent).free < _NEARLY_FULL:
                return DiskFullError(path)
        except OSError:
            pass
    return err


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a scratch directory beside `target`; on success it replaces `target` in one rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        _apply_umask(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException as err:
        full = _disk_full(err, target)
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not err:
            raise full from err
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        _apply_umask(Path(tmp))
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        full = _disk_full(err, path)
        if full is not err:
            raise full from err
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def remove_stale(folder: str | Path, depth: int = 1) -> list[Path]:
    """Remove the scratch files and folders (`.<name>.tmp-*`, `.<name>.old-*`) a killed run left
    in `folder` and in its sub-folders down to `depth` (1: e.g. `checkpoints/`); return what was
    removed. Not deeper: `--out .` must not walk a whole project. Call it only where no other
    process is writing, i.e. when the stage that owns the folder starts."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in sorted(folder.iterdir()):
        if _SCRATCH.match(p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        elif depth > 0 and p.is_dir() and not p.is_symlink():
            removed += remove_stale(p, depth - 1)
    return removed
