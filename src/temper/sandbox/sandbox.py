"""Run untrusted code (the model's) in a bubblewrap sandbox with limits, capped output and rollback.

One `Sandbox` owns one episode workspace: a host directory bound read-write at `/workspace`, the only
writable place besides a size-capped tmpfs `/tmp`. Everything else the sandbox sees is /usr and /etc
read-only; it has its own user, PID, network (only a loopback of its own), IPC, UTS and cgroup
namespaces, no capabilities, and cannot create user namespaces. Limits are rlimits set by `prlimit`
inside the sandbox just before the untrusted program starts, so RLIMIT_NPROC counts the processes of
this sandbox's user namespace only, not every process of the host uid (kernel ucounts, 5.14+).

The wall clock is enforced from outside: at the deadline the sandbox's PID-namespace init is killed,
which kills every process in the namespace (daemons included), then bubblewrap's process group.

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
from pathlib import Path

from temper.sandbox.probe import SANDBOX_UID, bwrap_base_args, popen_user_kwargs, probe


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program in it): an infrastructure error, never a result."""


class SandboxUnavailable(SandboxError):
    """No isolation tier works on this host and `unsafe=True` was not given."""


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall clock; the whole process tree is killed at the deadline
    cpu_s: float | None = None  # RLIMIT_CPU per process (SIGXCPU); None: ceil(wall_s)
    memory_mb: int = 1024  # RLIMIT_AS per process (a backstop: it bounds one process, not the tree)
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
    tier: str  # "bwrap", or "unsafe" (rlimits only, no isolation) when run with unsafe=True
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


def _default_python() -> str:
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


class Sandbox:
    """`Sandbox(workspace, limits).run(code)`; `snapshot()` / `rollback()` reset the workspace between
    episodes. Without a workspace, a fresh one is made under `workspace_root()`. `unsafe=True` runs with rlimits only where no tier is available (every result says
    `tier="unsafe"`); it is refused otherwise."""

    def __init__(
        self,
        workspace: str | os.PathLike | None = None,
        limits: Limits | None = None,
        *,
        unsafe: bool = False,
        python: str | None = None,
        ro_binds: tuple[str, ...] = (),
    ):
        if workspace is None:
            workspace = tempfile.mkdtemp(prefix="ws-", dir=workspace_root())
        self.workspace = Path(workspace).resolve()
        self.limits = limits or Limits()
        self.host = probe()
        if self.host.tier is None and not unsafe:
            raise SandboxUnavailable(
                f"no sandbox tier works on this host: {self.host.reason}. Untrusted code is not run "
                "unisolated unless you pass unsafe=True (rlimits only: no filesystem, network or "
                "process isolation)."
            )
        if self.host.prlimit is None:  # tier A needs it too, so only the unsafe path gets here
            raise SandboxUnavailable("even unsafe=True needs `prlimit` (util-linux) to set rlimits")
        self.tier = self.host.tier or "unsafe"
        self.python = python
        self.ro_binds = tuple(ro_binds)
        self.workspace.mkdir(parents=True, exist_ok=True)
        self._uid = SANDBOX_UID if os.geteuid() == 0 else None
        if self._uid is not None:
            _check_reachable(self.workspace)
            _chown_tree(self.workspace, self._uid)
        self._snapshot: Path | None = None

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
        prefix = [self.python or _default_python(), "-B", "-c"] if lang == "python" else _LANGS[lang]
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

    def _argv(self, argv: list[str], status_fd: int) -> list[str]:
        if self.tier == "unsafe":
            return [*self._rlimit_args(), *argv]
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
            "--",
            *self._rlimit_args(),
            *argv,
        ]

    def run_cmd(self, argv: list[str]) -> RunResult:
        """Run argv (resolved inside the sandbox; cwd /workspace) under the limits."""
        lim = self.limits
        status_r, status_w = os.pipe()
        t0 = time.monotonic()
        deadline = t0 + lim.wall_s
        try:
            proc = subprocess.Popen(
                self._argv(list(argv), status_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=() if self.tier == "unsafe" else (status_w,),
                start_new_session=True,  # one process group to kill: bwrap (or the unsafe program)
                cwd=str(self.workspace) if self.tier == "unsafe" else None,
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
                **popen_user_kwargs(),
            )
        except OSError as e:
            for fd in (status_r, status_w):
                os.close(fd)
            raise SandboxError(f"could not start the sandbox: {e}") from e
        os.close(status_w)
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
        while open_fds:
            now = time.monotonic()
            if now >= deadline and not timed_out:
                timed_out = True
                self._kill(proc, child_pid or self._child_pid(status))
            if timed_out and now > deadline + 10.0:  # the kill did not close the pipes: never hang
                self._kill(proc, None)
                raise SandboxError("the sandbox kept its output open 10 s after the wall-clock kill")
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # The unsafe tier has no PID namespace: an orphan holding the pipes open is killed with
            # the process group after a short grace (research note §2: 0.2 s).
            if self.tier == "unsafe" and exited_at is not None and now - exited_at > 0.2:
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
