"""Host-side reads of an episode workspace the agent's shell has written to.

Code the agent ran may have planted symlinks anywhere in the workspace (a `calc -> /etc` link, a
`util.py -> /root/.ssh/id_rsa` one), so every path is walked one component at a time with
`O_NOFOLLOW` from a directory descriptor: a symlink, at any depth, is never followed; only regular
files are read, each cut at `MAX_FILE_BYTES`, at most `MAX_FILES` of them and `MAX_DEPTH` levels
(an agent can make millions of files; the snapshot must stay cheap).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 16_384
MAX_FILES = 64
MAX_DEPTH = 4
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def _read_at(dir_fd: int, name: str) -> str | None:
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_FILE_BYTES).decode(errors="replace")
    finally:
        os.close(fd)


def read_file(root: Path, relpath: str) -> str | None:
    """The text of `root/relpath` when every component is a real directory and the last a regular
    file (no symlink followed); None otherwise."""
    parts = relpath.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    try:
        fd = os.open(root, _DIR)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return _read_at(fd, parts[-1])
    except OSError:
        return None
    finally:
        os.close(fd)


def read_tree(root: Path, under: str = "") -> dict[str, str]:
    """Every regular file below `root/under` (relative path -> text), within the module's caps,
    in sorted order (so the snapshot is a pure function of the tree when the caps bind)."""
    out: dict[str, str] = {}

    def walk(fd: int, prefix: str, depth: int) -> None:
        for name in sorted(os.listdir(fd)):
            if len(out) >= MAX_FILES:
                return
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                text = _read_at(fd, name)
                if text is not None:
                    out[prefix + name] = text
            elif stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
                try:
                    sub = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    continue
                try:
                    walk(sub, f"{prefix}{name}/", depth + 1)
                finally:
                    os.close(sub)

    try:
        fd = _open_dir(root, under)
    except OSError:  # missing, a symlink, or a file where a directory should be
        return out
    try:
        walk(fd, f"{under}/" if under else "", 1)
    finally:
        os.close(fd)
    return out


def _open_dir(root: Path, relpath: str) -> int:
    fd = os.open(root, _DIR)
    try:
        for part in relpath.split("/") if relpath else ():
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Write `files` (relative path -> text) under a fresh `root` this process made (trusted)."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
