"""Tier B launcher: run one command under Landlock + seccomp + rlimits, without namespaces.

Executed by path with the trainer's interpreter (`python -I -S -B tier_b_exec.py CONFIG ARGV...`,
stdlib only, so the sandboxed side never imports temper; CONFIG is a `marshal`ed dict in hex, because
`json` would import `re` and cost ~10 ms a call), in a new session, as root or as the caller:

1. joins the per-episode cgroups (v1 pids/memory, when the Sandbox made them: needs root),
2. sets the rlimits, then drops to the sandbox uid (root callers only),
3. becomes a *child subreaper* and forks: the child applies no_new_privs, Landlock and seccomp and
   execs the command; this process stays as a small supervisor outside the Landlock domain.

Why a supervisor: without a PID namespace a `setsid` daemon leaves the process group (so a kill of
the group misses it), and orphans would go to PID 1, which on these VMs reaps them only a second or
so later (zombies that count against the sandbox uid's RLIMIT_NPROC meanwhile). As a
subreaper every orphan of the tree is re-parented to the supervisor, so "my descendants" is exactly
the sandbox's processes, daemons included: when the command exits (or the Sandbox sends SIGUSR1 at
the deadline) the supervisor SIGKILLs and reaps all of them, then reports the command's status on
the status fd as one line: `exit N`, `signal N`, or `error MESSAGE` (the sandbox itself failed).
Landlock's signal scoping (ABI >= 6) stops the sandboxed code from killing its supervisor, and
Landlock always forbids ptrace-style access to processes outside the domain.

Landlock and seccomp are raw syscalls through ctypes rather than the PyPI `landlock` / `pyseccomp`
packages: the three Landlock syscalls and a ~40-instruction BPF filter are short, need no
dependency the sandbox's interpreter would have to import, and pyseccomp would in turn need the
system libseccomp. Constants are from the kernel's uapi headers (linux/landlock.h, linux/seccomp.h,
linux/filter.h, linux/audit.h) and the syscall tables of x86_64 and aarch64.
"""

# `signal` wraps this builtin in enums, and importing `enum` costs ~10 ms per sandboxed call
import _signal as signal
import ctypes
import marshal
import os
import resource
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# ---- Landlock (linux/landlock.h) ---------------------------------------------------------------
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # all arches
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the uapi header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    v = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(v), 0)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ret


def landlock_ruleset(
    abi: int, ro: list[str], rw: list[str], dev_files: list[str], optional_ro: list[str]
) -> int:
    """A ruleset fd: read+execute under `ro`, everything under `rw`, read/write the `dev_files`, no
    TCP bind or connect (ABI >= 4: no net rule is added, so every port is denied), signals and
    abstract unix sockets scoped to the domain (ABI >= 6). Paths in `optional_ro` may be missing."""
    fs_all = (1 << 13) - 1  # the 13 rights of ABI 1
    fs_all |= FS_REFER if abi >= 2 else 0
    fs_all |= FS_TRUNCATE if abi >= 3 else 0
    fs_all |= FS_IOCTL_DEV if abi >= 5 else 0
    attr = RulesetAttr(
        fs_all,
        NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0,
    )
    # the struct grew with the ABI; the kernel accepts the size of any version it knows
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = _check(
        libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0), "landlock_create_ruleset"
    )
    file_rw = FS_READ_FILE | FS_WRITE_FILE | (fs_all & (FS_TRUNCATE | FS_IOCTL_DEV))
    rules = [(p, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR, False) for p in ro]
    rules += [(p, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR, True) for p in optional_ro]
    rules += [(p, fs_all, False) for p in rw]
    rules += [(p, file_rw, True) for p in dev_files]
    for path, access, optional in rules:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            if optional:
                continue
            raise
        if not os.path.isdir(path):  # a rule on a file may carry only file rights
            access &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
        rule = PathBeneathAttr(access, pfd)
        _check(
            libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0),
            f"landlock_add_rule {path}",
        )
        os.close(pfd)
    return fd


# ---- seccomp (linux/seccomp.h, linux/filter.h) -------------------------------------------------
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 38, 22, 36, 1
SECCOMP_MODE_FILTER = 2
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
EPERM, EACCES, ENOSYS = 1, 13, 38
AF_UNIX = 1
# every namespace flag clone() accepts: CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
CLONE_NS_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# arch -> (AUDIT_ARCH, {name: nr}); the generic numbers (io_uring, new mount API, clone3, pidfd_getfd)
# are the same on both
_GENERIC = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "mount_setattr": 442,
}  # fmt: skip
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "socket": 41, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308, "mount": 165,
        "umount2": 166, "pivot_root": 155, "ptrace": 101, "bpf": 321, "keyctl": 250, "add_key": 248,
        "request_key": 249, "perf_event_open": 298, "userfaultfd": 323, "process_vm_readv": 310,
        "process_vm_writev": 311, **_GENERIC}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "ptrace": 117, "bpf": 280, "keyctl": 219, "add_key": 217,
        "request_key": 218, "perf_event_open": 241, "userfaultfd": 282, "process_vm_readv": 270,
        "process_vm_writev": 271, **_GENERIC}),
}  # fmt: skip
DENIED = [
    "unshare", "setns", "mount", "umount2", "pivot_root", "ptrace", "bpf", "keyctl", "add_key",
    "request_key", "perf_event_open", "userfaultfd", "process_vm_readv", "process_vm_writev",
    "pidfd_getfd", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # io_uring performs socket and file operations without the syscalls this filter sees
    "io_uring_setup", "io_uring_enter", "io_uring_register",
]  # fmt: skip


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The BPF filter, as (code, jt, jf, k) instructions on struct seccomp_data (nr at offset 0,
    arch at 4, args[0]'s low word at 16 on these little-endian arches)."""
    arch = os.uname().machine
    if arch not in SYSCALLS:
        raise OSError(ENOSYS, f"tier B's seccomp filter knows x86_64 and aarch64, not {arch}")
    audit_arch, nr = SYSCALLS[arch]
    prog = [
        (LD_W_ABS, 0, 0, 4),
        (JEQ_K, 1, 0, audit_arch),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, 0),
    ]
    if arch == "x86_64":  # the x32 ABI (nr | 0x40000000) would bypass every number below
        prog += [(JGE_K, 0, 1, 0x40000000), (RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    for name in DENIED:
        prog += [(JEQ_K, 0, 1, nr[name]), (RET_K, 0, 0, RET_ERRNO | EPERM)]
    # clone3 passes its flags in a struct the filter cannot read: ENOSYS makes libc fall back to clone
    prog += [(JEQ_K, 0, 1, nr["clone3"]), (RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    # socket(): only AF_UNIX. INET/INET6/PACKET as asked, and also NETLINK, VSOCK (the VM's host
    # channel), ALG, ...: EACCES, the errno Landlock gives a denied connect
    prog += [
        (JEQ_K, 0, 4, nr["socket"]),
        (LD_W_ABS, 0, 0, 16),
        (JEQ_K, 1, 0, AF_UNIX),
        (RET_K, 0, 0, RET_ERRNO | EACCES),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    # clone() with a namespace flag
    prog += [
        (JEQ_K, 0, 4, nr["clone"]),
        (LD_W_ABS, 0, 0, 16),
        (JSET_K, 0, 1, CLONE_NS_MASK),
        (RET_K, 0, 0, RET_ERRNO | EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    prog += [(RET_K, 0, 0, RET_ALLOW)]
    return prog


def apply_seccomp(prog: list[tuple[int, int, int, int]]) -> None:
    insns = (SockFilter * len(prog))(*[SockFilter(*i) for i in prog])
    fprog = SockFprog(len(prog), insns)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


# ---- the supervisor ----------------------------------------------------------------------------
class Sweep(Exception):
    """Raised by the SIGUSR1 handler: the Sandbox's deadline passed, kill everything now."""


def _on_usr1(signum, frame):
    raise Sweep


def descendants(root: int) -> list[int]:
    """Pids below `root` in the process tree, from /proc/*/stat (setsid does not change parentage)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def sweep(statuses: dict[int, int], limit_s: float = 10.0) -> bool:
    """SIGKILL and reap every descendant until none is left; True when the tree is empty."""
    me, end = os.getpid(), time.monotonic() + limit_s
    while True:
        # reap what has exited; no children at all means no descendants (orphans come to us), which
        # is the usual case and spares the /proc scan (~5 ms)
        try:
            while (reaped := os.waitpid(-1, os.WNOHANG))[0]:
                statuses[reaped[0]] = reaped[1]
        except ChildProcessError:
            return True
        if time.monotonic() > end:
            return False
        for pid in descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    argv = sys.argv[2:]
    status_fd = cfg["status_fd"]

    def report(line: str) -> None:
        os.write(status_fd, (line + "\n").encode())

    try:
        for procs in cfg.get("cgroup_procs", []):  # as root, before the uid drop
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        for name, (soft, hard) in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))
        if cfg.get("uid") is not None:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        os.chdir(cfg["cwd"])
        abi = landlock_abi()
        if abi < 1:
            raise OSError(ENOSYS, "Landlock is not available")
        # everything is prepared before the fork: after the restrictions nothing may need new files
        ruleset = landlock_ruleset(abi, cfg["ro"], cfg["rw"], cfg["dev_files"], cfg["optional_ro"])
        prog = seccomp_program()
        _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    except Exception as e:
        report(f"error {type(e).__name__}: {e}")
        os._exit(127)

    signal.signal(signal.SIGUSR1, _on_usr1)
    child = os.fork()
    if child == 0:
        try:
            # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec:
            # the program gets the defaults (`head` is killed by SIGXFSZ at RLIMIT_FSIZE, as in tier A)
            for sig in (signal.SIGUSR1, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
            _check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
            os.close(ruleset)
            apply_seccomp(prog)
            os.set_inheritable(status_fd, False)  # closed by a successful exec: nothing to report
            os.execvpe(argv[0], argv, cfg["env"])
        except Sweep:  # the deadline came before the exec: a timeout, not a sandbox failure
            os._exit(128 + signal.SIGKILL)
        except BaseException as e:
            report(f"error cannot start {argv[0]!r}: {type(e).__name__}: {e}")
        os._exit(127)

    statuses: dict[int, int] = {}
    line = None
    try:  # (inside the try: a deadline signal at any point from here on still leads to the sweep)
        # the supervisor holds no output pipe (an orphan holding them is the program's, and is killed)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        while child not in statuses:
            pid, status = os.waitpid(-1, 0)
            statuses[pid] = status
    except Sweep:
        line = "killed"
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a second deadline signal must not cut the sweep
    clean = sweep(statuses)
    if line is None:
        status = statuses[child]
        line = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    if not clean:
        line = "error the sandbox's processes did not die in 10 s"
    report(line)
    os._exit(0)


if __name__ == "__main__":
    main()
