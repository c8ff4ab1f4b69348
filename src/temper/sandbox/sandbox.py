"""Run untrusted code (the model's) in a bubblewrap sandbox with limits, capped output and rollback.

One `Sandbox` owns one episode workspace: a host directory bound read-write at `/workspace`, the only
writable place besides a size-capped tmpfs `/tmp`. Everything else the sandbox sees is /usr and /etc
read-only; it has its own user, PID, network (only a loopback of its own), IPC, UTS and cgroup
namespaces, no capabilities, and cannot create user namespaces. Tier B's seccomp filter, applied by
bwrap, also refuses every socket family but AF_UNIX (AF_VSOCK, the VM's channel to its host, is in
no network namespace; INET to the own loopback goes too, as in tier B) and the kernel's escape
syscalls (io_uring, bpf, ptrace, ...). Limits are rlimits set by `prlimit`
inside the sandbox just before the untrusted program starts, so RLIMIT_NPROC counts the processes of
this sandbox's user namespace only, not every process of the host uid (kernel ucounts, 5.14+).

The wall clock is enforced from outside: at the deadline the sandbox's PID-namespace init is killed,
which kills every process in the namespace (daemons included), then bubblewrap's process group.

Tier B (`tier="landlock"`, hosts without user namespaces; `tier_b_exec.py`) runs the program at its
host path: the workspace is the only writable directory besides a private tmp dir, the system
directories are read+execute, TCP is denied by Landlock and every socket family but AF_UNIX by
seccomp, the same rlimits apply, and a supervisor process (a child subreaper) kills and reaps the whole
tree, `setsid` daemons included, when the program exits or at the deadline. A root caller also gets a
cgroup v1 pids + memory group per Sandbox (where /sys/fs/cgroup is writable) that caps the tree's
processes and memory and is swept as a backstop. /proc is not readable (it would show every host
process's command line). Known gaps of tier B: paths outside the rules can be stat'ed though not
opened; pathname unix sockets of the host can be connected to where file permissions allow (Landlock
ABI 7 does not cover connect); files under readable directories cannot be hidden; the private tmp
dir has no total size cap (RLIMIT_FSIZE caps each file); without a pids cgroup (non-root callers)
RLIMIT_NPROC is the only process cap, and it counts every process of the uid (concurrent episodes,
and a non-root caller's own).

Failures of the sandbox itself (bubblewrap refusing a bind, not starting the program) raise
`SandboxError`: an infrastructure error must never reach a reward function as a wrong answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from temper.sandbox.probe import (
    SANDBOX_UID,
    TIER_B_DEV_FILES,
    TIER_B_SYSTEM_RO,
    bwrap_base_args,
    popen_user_kwargs,
    probe,
    seccomp_fd,
    tier_b_argv,
)


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program in it): an infrastructure error, never a result."""


class SandboxUnavailable(SandboxError):
    """No isolation tier works on this host and `unsafe=True` was not given."""


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall clock; the whole process tree is killed at the deadline
    cpu_s: float | None = None  # RLIMIT_CPU per process (SIGXCPU); None: ceil(wall_s)
    memory_mb: int = 1024  # RLIMIT_AS per process; tier B's memory cgroup (root) also caps the tree
    procs: int = 64  # RLIMIT_NPROC, counted in the sandbox's own user namespace
    file_mb: int = 64  # RLIMIT_FSIZE: the largest file one write may grow
    tmp_mb: int = 64  # size of each tmpfs: /tmp and /dev/shm
    output_bytes: int = 1 << 20  # kept per stream; the rest is read and dropped, and flagged
    nofile: int = 256  # RLIMIT_NOFILE


@dataclasses.dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed at the wall-clock deadline; 128+N when killed by signal N
    timed_out: bool
    killed_reason: str | None  # "wall_clock", "cpu_time", "file_size", "signal:SIGSEGV", ...
    truncated: bool  # some output beyond Limits.output_bytes was dropped
    wall_s: float
    tier: str  # "bwrap", "landlock", or "unsafe" (rlimits only, no isolation) when run with unsafe=True
    dropped_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


_SIGNAL_REASONS = {
    signal.SIGXCPU: "cpu_time",
    signal.SIGXFSZ: "file_size",
    signal.SIGKILL: "signal:SIGKILL",
}

_LANGS = {"python": None, "sh": ["/bin/sh", "-c"], "bash": ["/bin/bash", "-c"]}
_MAX_ARG = 100_000  # below Linux's 128 KiB per-argument limit (MAX_ARG_STRLEN)


def default_python() -> str:
    """The interpreter a sandboxed `python` runs: the system's, which the sandbox can see."""
    # The system interpreter: a venv or pyenv interpreter usually lives under a home directory the
    # sandbox does not see (and pyenv's shim adds ~60 ms per call, research note §1).
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(p).exists():
            return p
    raise SandboxError("no /usr/bin/python3 to run python code in the sandbox; pass python=...")


def _chown_tree(root: Path, uid: int) -> None:
    # lchown: a symlink the sandboxed code planted must not make us chown its target on the host
    os.chown(root, uid, uid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # already gone, and with it the namespace


def _check_reachable(workspace: Path) -> None:
    """A root caller's sandbox runs bubblewrap as SANDBOX_UID, which must be able to walk to the
    workspace to bind it (bwrap resolves every bind source, an fd's too, by path)."""
    for d in reversed(workspace.parents):
        st = d.stat()
        if not st.st_mode & 0o001 and st.st_uid != SANDBOX_UID:
            raise SandboxError(
                f"the sandbox (uid {SANDBOX_UID}) cannot reach the workspace {workspace}: {d} is mode "
                f"{oct(st.st_mode & 0o777)} without o+x. Put workspaces under a directory others can "
                "traverse (chmod o+x), e.g. one made by temper.sandbox.workspace_root()."
            )


def workspace_root() -> Path:
    """A directory for episode workspaces that the sandbox uid can traverse but not list (0711)."""
    root = Path(tempfile.gettempdir()) / f"temper-sandbox-{os.geteuid()}"
    root.mkdir(mode=0o711, exist_ok=True)
    st = root.lstat()
    if st.st_uid != os.geteuid() or not root.is_dir() or root.is_symlink():
        raise SandboxError(f"{root} exists and is not a directory owned by uid {os.geteuid()}")
    os.chmod(root, 0o711)
    return root


def _clear_dir(root: Path) -> None:
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


_CGROUP_COUNTER = iter(range(1 << 62))


def _own_cgroup_v1(controller: str) -> Path | None:
    """This process's directory in the v1 hierarchy of `controller`, from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            d = Path(f"/sys/fs/cgroup/{controller}{path}")
            return d if d.is_dir() else None
    return None


def _make_cgroups(limits: Limits) -> list[Path]:
    """A fresh v1 pids and memory group for one tier-B Sandbox, below this process's own groups;
    each controller whose hierarchy is missing or not writable is left out (the supervisor's sweep
    still kills the tree; only the total caps are lost)."""
    made = []
    name = f"temper-sbx-{os.getpid()}-{next(_CGROUP_COUNTER)}"
    # pids.max counts the supervisor too; the memory cap is the per-process RLIMIT_AS applied to the
    # whole tree (four processes of 900 MB each are an OOM kill, not 3.6 GB: research note §2)
    settings = {
        "pids": [("pids.max", limits.procs + 1)],
        "memory": [
            ("memory.limit_in_bytes", limits.memory_mb << 20),
            ("memory.memsw.limit_in_bytes", limits.memory_mb << 20),  # no swapping around the cap
        ],
    }
    for ctrl, files in settings.items():
        own = _own_cgroup_v1(ctrl)
        if own is None or os.geteuid() != 0:
            continue
        _remove_stale_cgroups(own)
        d = own / name
        try:
            d.mkdir()
            for f, v in files:
                if (d / f).exists():
                    (d / f).write_text(str(v))
        except OSError:
            _remove_cgroup(d)
            continue
        made.append(d)
    return made


def _remove_stale_cgroups(parent: Path) -> None:
    """Groups left by a temper process that died without cleaning up (a SIGKILLed trainer): their
    owner's pid is in the name; kill what is still in them and remove them (research note §4)."""
    for d in parent.glob("temper-sbx-*-*"):
        try:
            owner = int(d.name.split("-")[2])
            os.kill(owner, 0)
            continue  # its owner is alive (another trainer's sandbox): not ours to touch
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        _kill_cgroups([d], limit_s=1.0)
        _remove_cgroup(d)


def _uid_processes(uid: int) -> int:
    """How many processes uid has now (RLIMIT_NPROC counts them all, not only the sandbox's)."""
    n = 0
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                n += e.stat().st_uid == uid
            except OSError:
                pass
    return n


def _cgroup_pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_cgroups(dirs: list[Path], limit_s: float = 5.0) -> int:
    """SIGKILL every process in the groups until they are empty; returns how many were found."""
    found = 0
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        pids = [pid for d in dirs for pid in _cgroup_pids(d)]
        if not pids:
            break
        found += len(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.002)
    return found


def _remove_cgroup(d: Path) -> None:
    # a v1 rmdir says EBUSY for a moment after its last process exits (research note §6.6)
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _cleanup_tier_b(cgroups: list[Path], tmp: Path | None) -> None:
    _kill_cgroups(cgroups, limit_s=1.0)
    for d in cgroups:
        _remove_cgroup(d)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


class Sandbox:
    """`Sandbox(workspace, limits).run(code)`; `snapshot()` / `rollback()` reset the workspace between
    episodes. Without a workspace, a fresh one is made under `workspace_root()`. `unsafe=True` runs with rlimits only where no tier is available (every result says
    `tier="unsafe"`); it is refused otherwise. `tier="bwrap"` or `"landlock"` (or the environment
    variable TEMPER_SANDBOX_TIER) forces a tier the probe found working, e.g. to test tier B on a host
    that has tier A; by default the strongest one is used. `close()` frees tier B's cgroups and tmp."""

    def __init__(
        self,
        workspace: str | os.PathLike | None = None,
        limits: Limits | None = None,
        *,
        unsafe: bool = False,
        python: str | None = None,
        ro_binds: tuple[str, ...] = (),
        tier: str | None = None,
    ):
        if workspace is None:
            workspace = tempfile.mkdtemp(prefix="ws-", dir=workspace_root())
        self.workspace = Path(workspace).resolve()
        self.limits = limits or Limits()
        self.host = probe()
        tier = tier or os.environ.get("TEMPER_SANDBOX_TIER") or None
        if tier is not None and tier not in ("bwrap", "landlock"):
            raise ValueError(f"tier must be 'bwrap' or 'landlock', got {tier!r}")
        if tier is not None and tier not in self.host.tiers:
            raise SandboxUnavailable(f"sandbox tier {tier!r} does not work on this host: {self.host.reason}")
        if self.host.tier is None and not unsafe:
            raise SandboxUnavailable(
                f"no sandbox tier works on this host: {self.host.reason}. Untrusted code is not run "
                "unisolated unless you pass unsafe=True (rlimits only: no filesystem, network or "
                "process isolation)."
            )
        self.tier = tier or self.host.tier or "unsafe"
        if self.tier != "landlock" and self.host.prlimit is None:  # tier A has it, so only unsafe
            raise SandboxUnavailable("even unsafe=True needs `prlimit` (util-linux) to set rlimits")
        self.python = python
        self.ro_binds = tuple(ro_binds)
        self.workspace.mkdir(parents=True, exist_ok=True)
        self._uid = SANDBOX_UID if os.geteuid() == 0 else None
        if self._uid is not None:
            _check_reachable(self.workspace)
            _chown_tree(self.workspace, self._uid)
        self._snapshot: Path | None = None
        self._cgroups: list[Path] = []
        self._tmp: Path | None = None
        if self.tier == "landlock":
            # tier B's private tmp dir (HOME and TMPDIR): beside the workspace, reachable by the uid
            self._tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=workspace_root()))
            if self._uid is not None:
                os.chown(self._tmp, self._uid, self._uid)
            self._cgroups = _make_cgroups(self.limits)
        self._finalizer = weakref.finalize(self, _cleanup_tier_b, self._cgroups, self._tmp)

    @property
    def cgroups(self) -> list[Path]:
        """Tier B's v1 cgroups (pids, memory) where they could be made; empty otherwise."""
        return list(self._cgroups)

    def close(self) -> None:
        """Kill anything left in tier B's cgroups and remove them and the private tmp dir."""
        self._finalizer()

    # ---- workspace rollback -------------------------------------------------------------------
    def snapshot(self) -> None:
        """Copy the workspace aside (a private 0700 directory the sandbox never sees). Files the host
        added since the Sandbox was made are handed to the sandbox uid first, so the episode (and every
        rollback) starts from a workspace it can write."""
        if self._uid is not None:
            _chown_tree(self.workspace, self._uid)
        self.discard_snapshot()
        snap = Path(tempfile.mkdtemp(prefix="temper-sbx-snap-"))
        shutil.copytree(self.workspace, snap / "ws", symlinks=True)
        self._snapshot = snap

    def rollback(self) -> None:
        """Make the workspace exactly what it was at `snapshot()` (whatever the episode did to it)."""
        if self._snapshot is None:
            raise SandboxError("rollback() without a snapshot(): nothing to restore")
        self.workspace.mkdir(parents=True, exist_ok=True)
        _clear_dir(self.workspace)
        shutil.copytree(self._snapshot / "ws", self.workspace, symlinks=True, dirs_exist_ok=True)
        if self._uid is not None:
            _chown_tree(self.workspace, self._uid)

    def discard_snapshot(self) -> None:
        if self._snapshot is not None:
            shutil.rmtree(self._snapshot, ignore_errors=True)
            self._snapshot = None

    # ---- running ------------------------------------------------------------------------------
    def run(self, code: str, lang: str = "python") -> RunResult:
        if lang not in _LANGS:
            raise ValueError(f"lang must be one of {sorted(_LANGS)}, got {lang!r}")
        if len(code.encode()) > _MAX_ARG:
            raise ValueError(
                f"code is {len(code.encode())} bytes, over the {_MAX_ARG}-byte argument limit; "
                "write it into the workspace and use run_cmd"
            )
        prefix = [self.python or default_python(), "-B", "-c"] if lang == "python" else _LANGS[lang]
        return self.run_cmd([*prefix, code])

    def _rlimit_args(self) -> list[str]:
        lim = self.limits
        cpu = math.ceil(lim.cpu_s if lim.cpu_s is not None else lim.wall_s)
        return [
            self.host.prlimit or "prlimit",
            f"--as={lim.memory_mb << 20}",
            # soft < hard so the kernel sends SIGXCPU (reported as "cpu_time") before SIGKILL
            f"--cpu={max(cpu, 1)}:{max(cpu, 1) + 1}",
            f"--nproc={lim.procs}",
            f"--fsize={lim.file_mb << 20}",
            f"--nofile={lim.nofile}",
            "--core=0",
            "--",
        ]

    def _tier_b_argv(self, argv: list[str], status_fd: int) -> list[str]:
        lim = self.limits
        cpu = max(math.ceil(lim.cpu_s if lim.cpu_s is not None else lim.wall_s), 1)
        ro = list(self.ro_binds)
        if self.python:  # an interpreter outside /usr needs its prefix (bin/.. of the real binary)
            ro.append(str(Path(os.path.realpath(self.python)).parents[1]))
        has_pids = any(d.parts[:5] == ("/", "sys", "fs", "cgroup", "pids") for d in self._cgroups)
        if has_pids:
            nproc = max(lim.procs, 4096)
        elif self._uid is None:  # a non-root caller's own processes count too: allow procs more
            nproc = lim.procs + _uid_processes(os.geteuid())
        else:
            nproc = lim.procs
        config = {
            "status_fd": status_fd,
            "uid": self._uid,
            "cwd": str(self.workspace),
            # the tier A values; soft < hard CPU so SIGXCPU ("cpu_time") comes before SIGKILL
            "rlimits": {
                "AS": [lim.memory_mb << 20] * 2,
                "CPU": [cpu, cpu + 1],
                # RLIMIT_NPROC counts every process of the uid, so concurrent episodes would share
                # it; where a pids cgroup caps this Sandbox's tree it is only a loose backstop
                "NPROC": [nproc] * 2,
                "FSIZE": [lim.file_mb << 20] * 2,
                "NOFILE": [lim.nofile] * 2,
                "CORE": [0, 0],
            },
            "cgroup_procs": [str(d / "cgroup.procs") for d in self._cgroups],
            "ro": ro,
            "optional_ro": TIER_B_SYSTEM_RO,
            "rw": [str(self.workspace), str(self._tmp)],
            "dev_files": TIER_B_DEV_FILES,
            "env": {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(self._tmp),
                "TMPDIR": str(self._tmp),
                "LANG": "C.UTF-8",
            },
        }
        return tier_b_argv(config, argv)

    def _argv(self, argv: list[str], status_fd: int, filter_fd: int | None = None) -> list[str]:
        if self.tier == "unsafe":
            return [*self._rlimit_args(), *argv]
        if self.tier == "landlock":
            return self._tier_b_argv(argv, status_fd)
        binds = []
        for b in self.ro_binds:
            binds += ["--ro-bind", b, b]
        return [
            *bwrap_base_args(self.host.bwrap),
            *binds,
            "--size",
            str(self.limits.tmp_mb << 20),
            "--tmpfs",
            "/tmp",
            # bwrap's /dev is a tmpfs as large as host memory: a capped /dev/shm, the rest read-only
            "--size",
            str(self.limits.tmp_mb << 20),
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/dev",
            "--bind",
            str(self.workspace),
            "/workspace",
            # bwrap's own root is a tmpfs with no size cap: read-only, so /workspace and the capped
            # /tmp are the only places a write can land
            "--remount-ro",
            "/",
            "--chdir",
            "/workspace",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/tmp",
            "--setenv",
            "TMPDIR",
            "/tmp",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--json-status-fd",
            str(status_fd),
            # the seccomp filter both tiers share (probe.seccomp_bpf): sockets other than AF_UNIX,
            # AF_VSOCK above all (no network namespace covers it), and the kernel's escape syscalls.
            # bwrap applies it just before its exec of prlimit, after its own namespace setup.
            "--seccomp",
            str(filter_fd),
            "--",
            *self._rlimit_args(),
            *argv,
        ]

    def run_cmd(self, argv: list[str]) -> RunResult:
        """Run argv (resolved inside the sandbox; cwd /workspace) under the limits."""
        lim = self.limits
        status_r, status_w = os.pipe()
        filter_fd = seccomp_fd() if self.tier == "bwrap" else None
        extra_fds = (status_w,) if filter_fd is None else (status_w, filter_fd)
        t0 = time.monotonic()
        deadline = t0 + lim.wall_s
        try:
            proc = subprocess.Popen(
                self._argv(list(argv), status_w, filter_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=() if self.tier == "unsafe" else extra_fds,
                start_new_session=True,  # one process group to kill: bwrap (or the unsafe program)
                cwd=str(self.workspace) if self.tier == "unsafe" else None,
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
                # tier B's launcher joins the cgroups as root, then drops to the uid itself
                **({} if self.tier == "landlock" else popen_user_kwargs()),
            )
        except OSError as e:
            for fd in (status_r, *extra_fds):
                os.close(fd)
            raise SandboxError(f"could not start the sandbox: {e}") from e
        for fd in extra_fds:
            os.close(fd)
        try:
            return self._supervise(proc, status_r, t0, deadline)
        finally:
            os.close(status_r)
            if proc.poll() is None:  # an exception above: leave nothing running
                self._kill(proc, None)
                proc.wait()

    def _kill(self, proc: subprocess.Popen, child_pid: int | None) -> None:
        # The PID-namespace init first: its death kills every process in the namespace, setsid
        # daemons included; then bwrap's own process group.
        for pid, kill in ((child_pid, os.kill), (proc.pid, os.killpg)):
            if pid is not None:
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if self._cgroups:  # tier B's backstop: whatever is still in the episode's groups
            _kill_cgroups(self._cgroups)

    def _supervise(self, proc: subprocess.Popen, status_r: int, t0: float, deadline: float) -> RunResult:
        cap = self.limits.output_bytes
        bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        dropped = 0
        status = bytearray()
        sel = selectors.DefaultSelector()
        for fd in (*bufs, status_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        open_fds = set(bufs) | {status_r}
        timed_out = False
        child_pid = None
        ns_init = None  # a pidfd on the PID namespace's init, to wait for the namespace's death
        exited_at = None
        hard_killed = False
        while open_fds:
            now = time.monotonic()
            if now >= deadline and not timed_out:
                timed_out = True
                if self.tier == "landlock":  # the supervisor kills and reaps the whole tree
                    try:
                        proc.send_signal(signal.SIGUSR1)
                    except ProcessLookupError:
                        pass
                else:
                    self._kill(proc, child_pid or self._child_pid(status))
            if timed_out and self.tier == "landlock" and now > deadline + 2.0 and not hard_killed:
                hard_killed = True  # the supervisor did not finish: kill its group and cgroups
                self._kill(proc, None)
            if timed_out and now > deadline + 10.0:  # the kill did not close the pipes: never hang
                self._kill(proc, None)
                raise SandboxError("the sandbox kept its output open 10 s after the wall-clock kill")
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # The unsafe tier has no PID namespace: an orphan holding the pipes open is killed with
            # the process group after a short grace (research note §2: 0.2 s).
            # Tier B's supervisor has killed the tree before exiting, so this is only a backstop.
            if self.tier in ("unsafe", "landlock") and exited_at is not None and now - exited_at > 0.2:
                self._kill(proc, None)
                break
            timeout = max(0.0, deadline - now) if not timed_out else 0.05
            for key, _ in sel.select(timeout=min(timeout, 0.1)):
                fd = key.fd
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if fd == status_r:
                    status += chunk
                    if child_pid is None and (child_pid := self._child_pid(status)) is not None:
                        ns_init = _pidfd(child_pid)
                    continue
                buf = bufs[fd]
                room = cap - len(buf)
                if room > 0:
                    buf += chunk[:room]
                dropped += max(0, len(chunk) - max(room, 0))
        sel.close()
        returncode = proc.wait()
        if ns_init is not None:
            # bwrap's outer process exits as soon as the init reports the program's status, while the
            # kernel may still be killing the namespace's other processes (a setsid daemon was seen in
            # state D after run returned). Kill the init (a no-op if it is already going) and wait
            # for it to exit, which the kernel only lets happen once every process in it is gone.
            try:
                signal.pidfd_send_signal(ns_init, signal.SIGKILL)
            except ProcessLookupError:
                pass
            dead = select.select([ns_init], [], [], 10.0)[0]
            os.close(ns_init)
            if not dead:
                raise SandboxError(
                    f"the sandbox's processes (namespace init {child_pid}) did not die in 10 s"
                )
        wall = time.monotonic() - t0
        out, err = (bytes(bufs[f.fileno()]) for f in (proc.stdout, proc.stderr))
        proc.stdout.close()
        proc.stderr.close()

        exit_code: int | None
        if self.tier == "unsafe":
            exit_code = returncode if returncode >= 0 else 128 - returncode
        elif self.tier == "landlock":
            exit_code = self._tier_b_exit_code(status, returncode, timed_out)
        else:
            # bwrap reports the program's exit status on the status fd; without one, bwrap itself
            # failed (a bind it could not make, a namespace it could not create), whatever its code
            ends = [e["exit-code"] for e in self._status_events(status) if "exit-code" in e]
            if not ends and not timed_out:
                raise SandboxError(
                    f"bubblewrap failed (exit {returncode}) before reporting the program's exit "
                    f"status: {err.decode(errors='replace').strip()[-2000:]}"
                )
            exit_code = ends[-1] if ends else None
        if timed_out:
            exit_code = None
            reason = "wall_clock"
        elif exit_code is not None and exit_code > 128 and (exit_code - 128) in signal.valid_signals():
            sig = signal.Signals(exit_code - 128)
            reason = _SIGNAL_REASONS.get(sig, f"signal:{sig.name}")
        else:
            reason = None
        return RunResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            exit_code=exit_code,
            timed_out=timed_out,
            killed_reason=reason,
            truncated=dropped > 0,
            wall_s=wall,
            tier=self.tier,
            dropped_bytes=dropped,
        )

    def _tier_b_exit_code(self, status: bytes, returncode: int, timed_out: bool) -> int | None:
        """The program's exit code from the supervisor's status lines (see tier_b_exec.py)."""
        if self._cgroups and _kill_cgroups(self._cgroups):
            # the supervisor's sweep should have left nothing: say so rather than hide it
            raise SandboxError("tier B: processes outlived the supervisor's sweep (killed by the cgroup)")
        lines = status.decode(errors="replace").splitlines()
        errors = [ln[6:] for ln in lines if ln.startswith("error ")]
        if errors:
            raise SandboxError(f"the tier B sandbox failed: {'; '.join(errors)}")
        last = lines[-1].split() if lines else []
        if last[:1] == ["exit"]:
            return int(last[1])
        if last[:1] == ["signal"]:
            return 128 + int(last[1])
        if timed_out:
            return None
        raise SandboxError(
            f"the tier B supervisor ended (exit code {returncode}) without reporting the program's status"
        )

    @staticmethod
    def _status_events(status: bytes) -> list[dict]:
        events = []
        for line in status.decode(errors="replace").splitlines():
            line = line.strip()
            if line:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut at the kill; the complete ones are enough
        return events

    @classmethod
    def _child_pid(cls, status: bytes) -> int | None:
        for e in cls._status_events(status):
            if "child-pid" in e:
                return int(e["child-pid"])
        return None
