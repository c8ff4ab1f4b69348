"""Run untrusted code (the model's) in a bubblewrap sandbox with limits, capped output and rollback.

One `Sandbox` owns one episode workspace: a host directory bound read-write at `/workspace`, the only
writable place besides size-capped tmpfs `/tmp` and `/dev/shm`. Everything else the sandbox sees is
/usr and /etc read-only; it has its own user, PID, network (only a loopback of its own), IPC, UTS and
cgroup namespaces, no capabilities, and cannot create user namespaces. Tier B's seccomp filter,
applied by bwrap, also refuses every socket family but AF_UNIX (AF_VSOCK, the VM's channel to its
host, is in no network namespace; INET to the own loopback goes too, as in tier B) and the kernel's
escape syscalls (io_uring, bpf, ptrace, ...). Limits are rlimits set by `prlimit` inside the sandbox
just before the untrusted program starts, so RLIMIT_NPROC counts the processes of this sandbox's user
namespace only, not every process of the host uid (kernel ucounts, 5.14+).

Resources, on both tiers (issue 24): a memory cgroup per Sandbox caps the total memory of everything
it runs, tmpfs pages included (`cgroups.py`: v2 where delegated, v1 as root; without one,
`budget.fit` keeps procs x memory_mb under the host); the workspace, and tier B's tmp dir, have a
total size cap (`storage.py`: a size-capped tmpfs mounted on them as root, else a quota check that
kills the call, `killed_reason="disk_quota"`); every limit is fitted to MemTotal and the free disk
(`budget.py`). Tier A joins its group race-free: bwrap waits on `--block-fd` until its two processes
have been moved in. Each Sandbox has a private scratch directory (0700, removed by `close()`).

What tier A's program can learn of the host: bwrap's options (binds with host paths) go through
`--args FD` and its argv[0] is "bwrap", so /proc/1/cmdline names no host path; but /proc/1/exe and
/proc/1/maps show where the bwrap binary is (the wheel's, inside the venv: bwrap's init is dumpable
and runs as the program's uid, and the wheel's binary needs its bundled libcap by path, so it cannot
run from a memfd), and where the workspace is not a tmpfs of its own (non-root callers)
/proc/self/mountinfo shows its host path. After every call one zombie stays behind for as long as
the host's PID 1 takes to reap it (a second on these VMs, at once under systemd or tini): bwrap's
namespace init, which outlives bwrap's outer process; reaping it here would need this process to be
a child subreaper, which would make it adopt every orphan of every other subprocess the trainer
starts, so it is left to PID 1 (tier B's supervisor reaps its whole tree itself).

The wall clock is enforced from outside: at the deadline the sandbox's PID-namespace init is killed,
which kills every process in the namespace (daemons included), then bubblewrap's process group.

Tier B (`tier="landlock"`, hosts without user namespaces; `tier_b_exec.py`) runs the program at its
host path: the workspace is the only writable directory besides a private tmp dir, the system
directories are read+execute, TCP is denied by Landlock and every socket family but AF_UNIX by
seccomp, the same rlimits apply, and a supervisor process (a child subreaper) kills and reaps the whole
tree, `setsid` daemons included, when the program exits or at the deadline. It joins the same kind of
memory group, plus a pids group (v1: root; v2: delegated) that caps the tree's processes; both are
swept as a backstop. /proc is not readable (it would show every host process's command line).
Known gaps of tier B: paths outside the rules can be stat'ed though not opened; pathname unix
sockets of the host can be connected to where file permissions allow (Landlock ABI 7 does not cover
connect); files under readable directories cannot be hidden; without a pids cgroup (non-root
callers) RLIMIT_NPROC is the only process cap, and it counts every process of the uid (concurrent
episodes, and a non-root caller's own).

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

from temper.sandbox import budget, cgroups, storage
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
    # RLIMIT_AS of each process, and the sandbox's total where the host allows a memory cgroup (its
    # processes and what they write to its tmpfs filesystems; + GROUP_SLACK_MB); without a group,
    # procs is lowered so that procs x memory_mb stays under the host (budget.py)
    memory_mb: int = 1024
    procs: int = 64  # RLIMIT_NPROC (threads count), in tier A counted in its own user namespace
    file_mb: int = 64  # RLIMIT_FSIZE: the largest file one write may grow
    tmp_mb: int = 64  # total size of each tmp filesystem: tier A's /tmp and /dev/shm, tier B's tmp dir
    workspace_mb: int = 256  # total size of the workspace (storage.py: a tmpfs, or a quota check)
    output_bytes: int = 1 << 20  # kept per stream; the rest is read and dropped, and flagged
    nofile: int = 256  # RLIMIT_NOFILE


@dataclasses.dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when this side killed it (deadline, quota); 128+N when killed by signal N
    timed_out: bool
    # "wall_clock", "disk_quota" (the quota check's kill), "memory" (the program itself was killed by
    # the memory cgroup's cap), "cpu_time", "file_size", "signal:SIGSEGV", ...
    killed_reason: str | None
    truncated: bool  # some output beyond Limits.output_bytes was dropped
    wall_s: float
    tier: str  # "bwrap", "landlock", or "unsafe" (rlimits only, no isolation) when run with unsafe=True
    dropped_bytes: int = 0
    oom_kills: int = 0  # processes the memory cgroup's cap killed during this call

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


_SIGNAL_REASONS = {
    signal.SIGXCPU: "cpu_time",
    signal.SIGXFSZ: "file_size",
    signal.SIGKILL: "signal:SIGKILL",
}

# the memory group's cap is memory_mb plus this: page tables, kernel stacks and page cache it cannot
# drop at once are charged too, and one process should meet its own RLIMIT_AS (a MemoryError it can
# handle) before the group's OOM killer (measured: a 512 MB Python allocation loop peaks at 476 MB)
GROUP_SLACK_MB = 64

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


def _memfd_with(data: bytes, name: str) -> int:
    """A close-on-exec memfd holding data, at offset 0 (Popen's pass_fds hands it to the child)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _teardown(groups: list[Path], mounts: list[Path], scratch: Path) -> None:
    cgroups.kill(groups, limit_s=1.0)
    cgroups.remove(groups)
    for m in mounts:
        storage.unmount(m)
    shutil.rmtree(scratch, ignore_errors=True)


class Sandbox:
    """`Sandbox(workspace, limits).run(code)`; `snapshot()` / `rollback()` reset the workspace between
    episodes. Every Sandbox has a private scratch directory (mode 0700, in the system temp dir,
    removed by `close()`): without a workspace, a fresh one is made there (and goes with it), and
    tier B's tmp dir lives there. `unsafe=True` runs with rlimits only where no tier is available
    (every result says `tier="unsafe"`); it is refused otherwise. `tier="bwrap"` or `"landlock"` (or
    the environment variable TEMPER_SANDBOX_TIER) forces a tier the probe found working, e.g. to test
    tier B on a host that has tier A; by default the strongest one is used.

    `limits` are fitted to the host (`budget.py`; `self.limits` is what applies). `cgroups` lists the
    groups holding the total memory (and tier B's processes) where the host allows them
    (`cgroups.py`); `capped_dirs` says how the workspace and tier B's tmp are held to their total
    size: "tmpfs" (a size-capped tmpfs mounted on them for the Sandbox's life: a root caller; their
    files are gone after `close()`) or "quota" (measured while a call runs: `storage.py`).
    `close()` kills what is left in the groups, removes them, unmounts and deletes the scratch."""

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
        self._uid = SANDBOX_UID if os.geteuid() == 0 else None
        self._snapshot: Path | None = None
        self._cgroups: list[Path] = []
        self._mounts: list[Path] = []
        self._tmp: Path | None = None
        # the private scratch: 0700, owned by the uid the sandbox runs as (which must walk through
        # it to the default workspace), so no other user's process can enter it
        self._scratch = Path(tempfile.mkdtemp(prefix="temper-sbx-"))
        self._finalizer = weakref.finalize(self, _teardown, self._cgroups, self._mounts, self._scratch)
        try:
            if self._uid is not None:
                os.chown(self._scratch, self._uid, self._uid)
            if workspace is None:
                workspace = self._scratch / "ws"
                workspace.mkdir(mode=0o700)
            self.workspace = Path(workspace).resolve()
            self.workspace.mkdir(parents=True, exist_ok=True)
            if self._uid is not None:
                _check_reachable(self.workspace)
            if self.tier == "landlock":  # tier B's tmp dir (HOME and TMPDIR)
                self._tmp = self._scratch / "tmp"
                self._tmp.mkdir(mode=0o700)
            self._cap_resources(limits or Limits())
            if self._uid is not None:
                _chown_tree(self.workspace, self._uid)
                if self._tmp is not None:
                    os.chown(self._tmp, self._uid, self._uid)
        except BaseException:
            self._finalizer()
            raise

    def _cap_resources(self, limits: Limits) -> None:
        """The memory group, the size-capped tmpfs mounts (or the quota fallback) and the limits
        fitted to what the host allowed (see the class docstring)."""
        memory_mb = min(limits.memory_mb, budget.memory_cap_mb())
        if self.tier != "unsafe":
            # tier A's pids stay with RLIMIT_NPROC (counted in its own user namespace): bwrap's
            # PID-namespace init outlives bwrap as a zombie for as long as the host's PID 1 takes to
            # reap it, and a pids group would count those against the next calls
            pids = limits.procs + 1 if self.tier == "landlock" else None  # +1: the supervisor
            self._cgroups.extend(cgroups.make(memory_mb + GROUP_SLACK_MB, pids))
        dirs = {"workspace_mb": self.workspace}
        if self._tmp is not None:
            dirs["tmp_mb"] = self._tmp
        on_disk = {}
        for field, d in dirs.items():
            size = min(getattr(limits, field), budget.ramdisk_cap_mb())
            if self.tier != "unsafe" and self._uid is not None and storage.mount_tmpfs(d, size, self._uid):
                self._mounts.append(d)
            else:
                on_disk[field] = d
        self.capped_dirs = {f: "quota" if f in on_disk else "tmpfs" for f in dirs}
        if self.tier == "unsafe":
            self.capped_dirs = {}  # no isolation: the program can write anywhere anyway
        if self.tier == "bwrap":
            tmpfs_of_tmp = 2  # /tmp and /dev/shm
        else:
            tmpfs_of_tmp = int(self._tmp in self._mounts)
        self.limits = budget.fit(
            limits,
            memory_cgroup=cgroups.has_memory(self._cgroups),
            tmpfs_of_tmp=tmpfs_of_tmp,
            workspace_in_ram=self.workspace in self._mounts,
            disk_dirs=on_disk if self.tier != "unsafe" else {},
        )
        if self.tier == "landlock":
            cgroups.set_pids_max(self._cgroups, self.limits.procs + 1)
        self._quota = [(on_disk[f], getattr(self.limits, f)) for f in on_disk if self.tier != "unsafe"]
        self._oom_seen = cgroups.oom_kills(self._cgroups)

    @property
    def scratch(self) -> Path:
        """This Sandbox's private scratch directory (0700; removed by close())."""
        return self._scratch

    @property
    def cgroups(self) -> list[Path]:
        """The groups holding this Sandbox's total memory (tier B: and processes); empty where the
        host allows none (then `budget.fit` has bounded procs x memory_mb instead)."""
        return list(self._cgroups)

    def close(self) -> None:
        """Kill anything left in the groups and remove them; unmount the tmpfs mounts (their files
        are gone); delete the private scratch (the default workspace and tier B's tmp with it) and
        the snapshot, if any."""
        self.discard_snapshot()
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
        # fifos and sockets the sandbox made are left out: opening a fifo to copy it would block
        shutil.copytree(self.workspace, snap / "ws", symlinks=True, ignore=storage.specials)
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
        if cgroups.has_pids(self._cgroups):
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

    def _bwrap_options(self, status_fd: int, filter_fd: int, block_fd: int | None) -> list[str]:
        """Tier A's bwrap options. They reach bwrap through `--args FD`, not its command line: the
        sandbox sees bwrap's argv as /proc/1/cmdline, and these name host paths (the workspace, the
        read-only binds)."""
        binds = []
        for b in self.ro_binds:
            binds += ["--ro-bind", b, b]
        return [
            *bwrap_base_args(self.host.bwrap)[1:],
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
            # after the tmpfs mounts, so a read-only bind under /tmp (shared tools: pytest for the
            # shell env) is not covered by the sandbox's own /tmp
            *binds,
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
            # with a memory group: bwrap waits here, its namespaces made but nothing forked inside,
            # until both its processes have been moved into the group (_supervise)
            *(["--block-fd", str(block_fd)] if block_fd is not None else []),
        ]

    def run_cmd(self, argv: list[str]) -> RunResult:
        """Run argv (resolved inside the sandbox; cwd /workspace) under the limits."""
        lim = self.limits
        if self._quota and self._over_quota():  # still over from an earlier call: nothing runs
            return RunResult("", "", None, False, "disk_quota", False, 0.0, self.tier)
        status_r, status_w = os.pipe()
        to_close = [status_w]  # the child's ends, closed here once it has them
        block_w = None
        kwargs = {}
        try:
            if self.tier == "unsafe":
                cmd = [*self._rlimit_args(), *argv]
                kwargs = {"cwd": str(self.workspace), **popen_user_kwargs()}
            elif self.tier == "landlock":
                cmd = self._tier_b_argv(list(argv), status_w)
                kwargs = {"pass_fds": (status_w,)}  # its launcher joins the groups, then drops the uid
            else:
                filter_fd = seccomp_fd()
                to_close.append(filter_fd)
                block_r = None
                if self._cgroups:
                    block_r, block_w = os.pipe()
                    to_close.append(block_r)
                args_fd = _memfd_with(b"".join(a.encode() + b"\0" for a in self._bwrap_options(
                    status_w, filter_fd, block_r)), "bwrap-args")  # fmt: skip
                to_close.append(args_fd)
                # argv[0] "bwrap", not its host path (a venv's bwrap sits under a home directory);
                # /proc/1/exe and /proc/1/maps still show where the binary is (module docstring)
                cmd = ["bwrap", "--args", str(args_fd), "--", *self._rlimit_args(), *argv]
                kwargs = {"executable": self.host.bwrap, "pass_fds": tuple(to_close), **popen_user_kwargs()}
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # one process group to kill: bwrap (or the unsafe program)
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
                **kwargs,
            )
        except OSError as e:
            for fd in (status_r, block_w, *to_close):
                if fd is not None:
                    os.close(fd)
            raise SandboxError(f"could not start the sandbox: {e}") from e
        for fd in to_close:
            os.close(fd)
        try:
            return self._supervise(proc, status_r, t0, t0 + lim.wall_s, block_w)
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
        if self._cgroups:  # the backstop: whatever is still in the episode's groups
            cgroups.kill(self._cgroups)

    def _stop(self, proc: subprocess.Popen, child_pid: int | None) -> None:
        """Kill the program's whole tree now (the deadline, or the quota check)."""
        if self.tier == "landlock":  # the supervisor kills and reaps the whole tree
            try:
                proc.send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                pass
        else:
            self._kill(proc, child_pid)

    def _join_cgroups(self, proc: subprocess.Popen, child_pid: int, block_w: int) -> None:
        """Tier A: move bwrap and its namespace init (blocked on --block-fd, nothing forked inside
        yet) into the memory group, then let it go on. Every process of the sandbox is born in it."""
        try:
            for pid in (proc.pid, child_pid):
                cgroups.attach(self._cgroups, pid)
        except ProcessLookupError:
            return  # bwrap already failed; its status says why
        except OSError as e:
            self._kill(proc, child_pid)
            raise SandboxError(f"could not move the sandbox into its cgroup: {e}") from e
        try:
            os.write(block_w, b"1")
        except BrokenPipeError:
            pass

    def _over_quota(self) -> bool:
        return any(storage.over_cap([d], mb) for d, mb in self._quota)

    def _supervise(
        self, proc: subprocess.Popen, status_r: int, t0: float, deadline: float, block_w: int | None
    ) -> RunResult:
        try:
            return self._supervise_loop(proc, status_r, t0, deadline, block_w)
        finally:
            if block_w is not None:
                os.close(block_w)

    def _supervise_loop(
        self, proc: subprocess.Popen, status_r: int, t0: float, deadline: float, block_w: int | None
    ) -> RunResult:
        cap = self.limits.output_bytes
        bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        dropped = 0
        status = bytearray()
        sel = selectors.DefaultSelector()
        for fd in (*bufs, status_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        open_fds = set(bufs) | {status_r}
        killed = None  # why this side killed the program: "wall_clock" or "disk_quota"
        killed_at = 0.0
        # the quota check, where no tmpfs caps the size (run_cmd checked once before the start)
        next_check = t0 + storage.POLL_S if self._quota else math.inf
        child_pid = None
        ns_init = None  # a pidfd on the PID namespace's init, to wait for the namespace's death
        exited_at = None
        hard_killed = False
        while open_fds:
            now = time.monotonic()
            if killed is None:
                if now >= deadline:
                    killed = "wall_clock"
                elif now >= next_check:
                    next_check = now + storage.POLL_S
                    killed = "disk_quota" if self._over_quota() else None
                if killed is not None:
                    killed_at = now
                    self._stop(proc, child_pid or self._child_pid(status))
            if killed and self.tier == "landlock" and now > killed_at + 2.0 and not hard_killed:
                hard_killed = True  # the supervisor did not finish: kill its group and cgroups
                self._kill(proc, None)
            if killed and now > killed_at + 10.0:  # the kill did not close the pipes: never hang
                self._kill(proc, None)
                raise SandboxError("the sandbox kept its output open 10 s after it was killed")
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # The unsafe tier has no PID namespace: an orphan holding the pipes open is killed with
            # the process group after a short grace (research note §2: 0.2 s).
            # Tier B's supervisor has killed the tree before exiting, so this is only a backstop.
            if self.tier in ("unsafe", "landlock") and exited_at is not None and now - exited_at > 0.2:
                self._kill(proc, None)
                break
            timeout = max(0.0, min(deadline, next_check) - now) if not killed else 0.05
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
                        if block_w is not None:
                            self._join_cgroups(proc, child_pid, block_w)
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
        # filled between two checks, then exited: reported, though there was nothing left to kill
        overfilled = killed is None and bool(self._quota) and self._over_quota()
        wall = time.monotonic() - t0
        out, err = (bytes(bufs[f.fileno()]) for f in (proc.stdout, proc.stderr))
        proc.stdout.close()
        proc.stderr.close()
        oom = cgroups.oom_kills(self._cgroups)
        oom, self._oom_seen = oom - self._oom_seen, oom

        exit_code: int | None
        if self.tier == "unsafe":
            exit_code = returncode if returncode >= 0 else 128 - returncode
        elif self.tier == "landlock":
            exit_code = self._tier_b_exit_code(status, returncode, killed is not None)
        else:
            # bwrap reports the program's exit status on the status fd; without one, bwrap itself
            # failed (a bind it could not make, a namespace it could not create), whatever its code
            ends = [e["exit-code"] for e in self._status_events(status) if "exit-code" in e]
            if not ends and killed is None:
                raise SandboxError(
                    f"bubblewrap failed (exit {returncode}) before reporting the program's exit "
                    f"status: {err.decode(errors='replace').strip()[-2000:]}"
                )
            exit_code = ends[-1] if ends else None
        if killed:
            exit_code, reason = None, killed
        elif overfilled:
            reason = "disk_quota"
        elif exit_code == 128 + signal.SIGKILL and oom:
            reason = "memory"
        elif exit_code is not None and exit_code > 128 and (exit_code - 128) in signal.valid_signals():
            sig = signal.Signals(exit_code - 128)
            reason = _SIGNAL_REASONS.get(sig, f"signal:{sig.name}")
        else:
            reason = None
        return RunResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            exit_code=exit_code,
            timed_out=killed == "wall_clock",
            killed_reason=reason,
            truncated=dropped > 0,
            wall_s=wall,
            tier=self.tier,
            dropped_bytes=dropped,
            oom_kills=oom,
        )

    def _tier_b_exit_code(self, status: bytes, returncode: int, timed_out: bool) -> int | None:
        """The program's exit code from the supervisor's status lines (see tier_b_exec.py)."""
        if self._cgroups and cgroups.kill(self._cgroups):
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
