"""The shell's tools inside the sandbox: pytest for the system Python, and the command line of one
shell command.

The sandbox sees /usr and /etc read-only and its own workspace, not this process's virtualenv, so
the system interpreter it runs (`default_python`) has no pytest. Installing into /usr needs root
and the network; instead pytest and its pure-Python dependencies are copied from this process's
own installation (the same interpreter minor version is required: pure-Python packages, byte-
compiled once) into a directory under `workspace_root()`, made read-only to the sandbox and bound
into it (`Sandbox(ro_binds=...)`). The copy is made once per pytest version, into a temporary
directory renamed into place, so concurrent episodes never see half of it.

`bin/pytest` there runs `python3 -m pytest`; PATH puts that bin first. Each command runs as
`bash -c COMMAND` with cwd /workspace: files persist between commands (the workspace), shell state
(cd, variables, background jobs) does not; every command is one sandbox call under its limits.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py")
"""pytest and what it imports on Python 3.11+ (`py` is pytest's own one-file shim)."""


class ShellToolsUnavailable(RuntimeError):
    """pytest cannot be given to the sandbox (not installed here, or another Python minor)."""


@functools.cache
def tools_dir() -> Path:
    """The read-only tools directory (module docstring), made on first use."""
    from temper.sandbox import workspace_root
    from temper.sandbox.sandbox import default_python

    spec = importlib.util.find_spec("pytest")
    if spec is None or spec.origin is None:
        raise ShellToolsUnavailable("the shell environment needs pytest: pip install 'temper[shell]'")
    import pytest

    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = default_python()
    have = subprocess.run(
        [python, "-c", "import sys; print(f'{sys.version_info.major}.{sys.version_info.minor}')"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if have != want:
        raise ShellToolsUnavailable(
            f"the sandbox's {python} is Python {have}, this process is {want}: pytest cannot be shared"
        )
    root = workspace_root() / f"shell-tools-pytest-{pytest.__version__}-py{want}"
    if (root / "bin" / "pytest").exists():
        return root
    tmp = Path(tempfile.mkdtemp(prefix="shell-tools-", dir=root.parent))
    try:
        (tmp / "lib").mkdir()
        for name in PYTEST_PACKAGES:
            found = importlib.util.find_spec(name)
            if found is None or found.origin is None:
                raise ShellToolsUnavailable(f"pytest's dependency {name} is not importable here")
            origin = Path(found.origin)
            if origin.name == "__init__.py":
                shutil.copytree(
                    origin.parent, tmp / "lib" / name, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy(origin, tmp / "lib" / origin.name)
        subprocess.run([python, "-m", "compileall", "-q", str(tmp / "lib")], check=True, capture_output=True)
        (tmp / "bin").mkdir()
        (tmp / "bin" / "pytest").write_text(f'#!/bin/sh\nexec {python} -m pytest "$@"\n')
        (tmp / "bin" / "python").symlink_to(python)
        for d, _, files in os.walk(tmp):
            os.chmod(d, 0o755)
            for f in files:
                p = os.path.join(d, f)
                if not os.path.islink(p):
                    os.chmod(p, 0o755 if f == "pytest" else 0o644)
        try:
            os.rename(tmp, root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def shell_argv(command: str, tools: Path) -> list[str]:
    """`bash -c command` with pytest on PATH and PYTHONPATH (the tools directory), no bytecode
    written into the workspace and a narrow terminal (pytest draws its rules as wide as COLUMNS, 40 at the least,
    and cuts its summary lines there)."""
    return [
        "/usr/bin/env",
        f"PATH={tools}/bin:/usr/local/bin:/usr/bin:/bin",
        f"PYTHONPATH={tools}/lib",
        "PYTHONDONTWRITEBYTECODE=1",
        "COLUMNS=40",
        "/bin/bash",
        "-c",
        command,
    ]
