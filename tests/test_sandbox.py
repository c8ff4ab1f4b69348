"""The sandbox's attack battery: each test runs one attack and asserts it was contained.

Limits are short (1-2 s) so the whole battery stays well under 20 s. Tests that need isolation skip,
with the probe's reason, only on a host where no tier works.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from temper.sandbox import Limits, Sandbox, SandboxError, SandboxUnavailable, probe, workspace_root
from temper.sandbox import sandbox as sandbox_mod

HOST = probe()
needs_tier = pytest.mark.skipif(
    HOST.tier is None, reason=f"this host lacks every sandbox tier: {HOST.reason}"
)
FAST = Limits(wall_s=2.0, memory_mb=512, procs=32, output_bytes=4096, file_mb=8, tmp_mb=16)


@pytest.fixture
def base():
    """A directory the sandbox uid can walk to (pytest's tmp_path is 0700 under a root caller)."""
    d = Path(tempfile.mkdtemp(dir=workspace_root()))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d)


@pytest.fixture
def sbx(base):
    return Sandbox(base / "ws", FAST)


def _procs_with(token: str) -> list[int]:
    """Host pids whose command line contains token (a marker the attack put in its argv)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if token.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@needs_tier
def test_normal_run_reports_output_exit_code_and_tier(sbx):
    r = sbx.run("import sys; print('hi'); print('err', file=sys.stderr); sys.exit(3)")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.truncated) == ("hi\n", "err\n", 3, False, False)
    assert r.tier == "bwrap" and r.killed_reason is None
    assert sbx.run("echo $0", lang="sh").stdout == "/bin/sh\n"


@needs_tier
def test_fork_bomb_is_bounded_by_nproc(sbx):
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n        n += 1\n"
        "except OSError as e:\n    print(n, e.errno)\n"
    )
    r = sbx.run(code)
    n, errno = map(int, r.stdout.split())
    assert errno == 11 and n < FAST.procs  # EAGAIN before the limit; the host is untouched
    assert not r.timed_out  # the bomb's children died with the PID namespace when the parent exited
    assert _procs_with("import os, time") == []


@needs_tier
def test_memory_bomb_fails_inside(sbx):
    r = sbx.run("b = bytearray(10**10)")
    assert r.exit_code == 1 and "MemoryError" in r.stderr
    r = sbx.run("x = []\nwhile True: x.append(bytearray(50 << 20))")
    assert r.exit_code == 1 and "MemoryError" in r.stderr


@needs_tier
def test_cpu_spin_killed_at_wall_clock(sbx):
    t = time.monotonic()
    r = sbx.run("while True: pass")
    assert r.timed_out and r.exit_code is None and r.killed_reason == "wall_clock"
    assert time.monotonic() - t < FAST.wall_s + 1.0


@needs_tier
def test_cpu_time_limit_sends_sigxcpu(base):
    r = Sandbox(base / "ws", Limits(wall_s=8, cpu_s=1)).run("while True: pass")
    assert not r.timed_out and r.killed_reason == "cpu_time" and r.exit_code == 128 + 24


@needs_tier
def test_sleep_past_timeout_returns_at_deadline(sbx):
    r = sbx.run("import time; time.sleep(30)")
    assert r.timed_out and FAST.wall_s <= r.wall_s < FAST.wall_s + 1.0


@needs_tier
def test_network_egress_fails_fast(sbx):
    code = (
        "import socket, time\nt = time.monotonic()\ns = socket.socket()\ns.settimeout(5)\n"
        "try:\n    s.connect(('1.1.1.1', 53)); print('CONNECTED')\n"
        "except OSError as e:\n    print(type(e).__name__, round(time.monotonic() - t, 3))\n"
        "print(socket.if_nameindex())\n"
    )
    r = sbx.run(code)
    first, ifaces = r.stdout.splitlines()
    kind, took = first.split()
    assert kind == "OSError" and float(took) < 0.5  # ENETUNREACH at once, not a 5 s timeout
    assert ifaces == "[(1, 'lo')]"  # the sandbox's network namespace has only its own loopback


@needs_tier
def test_host_loopback_service_unreachable(sbx):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.setblocking(False)
    port = srv.getsockname()[1]
    code = (
        f"import socket\ns = socket.socket()\ns.settimeout(1)\ntry:\n    s.connect(('127.0.0.1', {port}))\n"
        "    print(s.recv(100))\nexcept OSError as e:\n    print(type(e).__name__)\n"
    )
    r = sbx.run(code)
    assert r.stdout.strip() == "ConnectionRefusedError"
    with pytest.raises(BlockingIOError):  # nothing reached the host's listener, not even a SYN
        srv.accept()
    srv.close()


@needs_tier
def test_writes_outside_workspace_fail(sbx, tmp_path):
    host_file = tmp_path / "outside.txt"
    code = (
        "import os\nfor p in ['/etc/evil', '/usr/evil', '/evil', " + repr(str(host_file)) + "]:\n"
        "    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError as e:\n        print(e.errno)\n"
        "open('/workspace/mine.txt', 'w').write('ok')\n"
    )
    r = sbx.run(code)
    assert "WROTE" not in r.stdout and r.exit_code == 0, r
    assert not host_file.exists() and not Path("/etc/evil").exists()
    assert (sbx.workspace / "mine.txt").read_text() == "ok"  # the workspace is the writable place


@needs_tier
def test_other_episode_workspace_invisible(base):
    a = Sandbox(base / "a", FAST)
    b = Sandbox(base / "b", FAST)
    (b.workspace / "secret.txt").write_text("B-SECRET")
    code = (
        f"import os\nfor p in [{str(b.workspace / 'secret.txt')!r}, {str(base)!r}]:\n"
        "    print(os.path.exists(p))\n"
        "print(os.listdir('/workspace'))\n"
    )
    r = a.run(code)
    assert r.stdout.splitlines() == ["False", "False", "[]"]
    assert "B-SECRET" not in a.run("cat /workspace/../*/secret.txt 2>&1", lang="sh").stdout


@needs_tier
def test_daemon_dies_with_the_episode(sbx):
    marker = "31337.271828"
    code = (
        "import subprocess\n"
        "for _ in range(20):\n"  # many, so a teardown still in progress when run returns shows
        f"    subprocess.Popen(['sleep', '{marker}'], start_new_session=True,\n"
        "        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"subprocess.Popen(['nohup', 'sleep', '{marker}'])\n"  # this one keeps stdout open
        "print('started')\n"
    )
    t = time.monotonic()
    r = sbx.run(code)
    assert r.stdout.startswith("started") and not r.timed_out and time.monotonic() - t < 1.5
    assert _procs_with(marker) == []


@needs_tier
def test_huge_output_capped_and_prompt(sbx):
    t = time.monotonic()
    r = sbx.run("import sys\nfor _ in range(100):\n    sys.stdout.buffer.write(b'x' * (1 << 20))")
    assert r.exit_code == 0 and r.truncated and len(r.stdout) == FAST.output_bytes
    assert r.dropped_bytes == 100 * (1 << 20) - FAST.output_bytes
    assert time.monotonic() - t < 5.0


@needs_tier
def test_rm_rf_workspace_then_rollback(sbx):
    (sbx.workspace / "src").mkdir()
    (sbx.workspace / "src" / "main.py").write_text("print(1)\n")
    (sbx.workspace / "data.txt").write_text("keep me")
    sbx.snapshot()
    r = sbx.run(
        "rm -rf /workspace/* /workspace/.[!.]* ; echo pwned > /workspace/new; ls -A /workspace", lang="sh"
    )
    assert r.stdout.split() == ["new"]
    sbx.rollback()
    files = sorted(str(p.relative_to(sbx.workspace)) for p in sbx.workspace.rglob("*"))
    assert files == ["data.txt", "src", "src/main.py"]
    assert (sbx.workspace / "data.txt").read_text() == "keep me"
    assert sbx.run("print(open('src/main.py').read(), end='')").stdout == "print(1)\n"  # writable again
    sbx.discard_snapshot()


@needs_tier
def test_large_file_capped_by_fsize(sbx):
    r = sbx.run("open('big', 'wb').write(b'x' * (20 << 20))")  # Python ignores SIGXFSZ: EFBIG
    assert r.exit_code == 1 and "File too large" in r.stderr
    r = sbx.run("head -c 20000000 /dev/zero > big2", lang="sh")  # a program that does not: SIGXFSZ
    assert r.killed_reason == "file_size"
    assert max((sbx.workspace / f).stat().st_size for f in ("big", "big2")) <= FAST.file_mb << 20
    # the in-memory filesystems are capped in total, not only per file; the rest of /dev is read-only
    script = "for i in 1 2 3; do head -c 7000000 /dev/zero > /tmp/f$i; head -c 7000000 /dev/zero > /dev/shm/f$i; done"
    r = sbx.run(
        script + " 2>/dev/null; du -sk /tmp /dev/shm | cut -f1; touch /dev/x 2>/dev/null || echo RO",
        lang="sh",
    )
    tmp_kb, shm_kb, ro = r.stdout.split()
    assert int(tmp_kb) <= FAST.tmp_mb << 10 and int(shm_kb) <= FAST.tmp_mb << 10 and ro == "RO", r.stdout


@needs_tier
def test_no_capabilities_and_no_nested_userns(sbx):
    r = sbx.run("grep CapEff /proc/self/status; unshare -U -r true 2>/dev/null && echo NESTED", lang="sh")
    assert r.stdout.split() == ["CapEff:", "0000000000000000"]


@needs_tier
def test_bubblewrap_failure_is_an_error_not_a_result(base):
    s = Sandbox(base / "ws", FAST, ro_binds=(str(base / "does-not-exist"),))
    with pytest.raises(SandboxError, match="bubblewrap failed.*does-not-exist"):
        s.run("print(1)")


def test_no_tier_refuses_unless_unsafe(base, monkeypatch):
    none = type(HOST)(None, None, None, HOST.prlimit, "user namespaces disabled (test)")
    monkeypatch.setattr(sandbox_mod, "probe", lambda: none)
    with pytest.raises(SandboxUnavailable, match="user namespaces disabled"):
        Sandbox(base / "ws", FAST)
    if HOST.prlimit is None:
        pytest.skip("no prlimit: the unsafe tier needs it for rlimits")
    s = Sandbox(base / "ws", FAST, unsafe=True)
    r = s.run("import os; print(os.getcwd())")
    assert r.tier == "unsafe" and r.exit_code == 0 and r.stdout.strip() == str(s.workspace)
    r = s.run("import time; time.sleep(30)")
    assert r.tier == "unsafe" and r.timed_out and r.wall_s < FAST.wall_s + 1.0


@needs_tier
def test_root_caller_runs_sandbox_as_unprivileged_uid(sbx, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only a root caller drops to SANDBOX_UID")
    sbx.run("open('f', 'w').write('x')")
    assert (sbx.workspace / "f").stat().st_uid == 10001
    r = sbx.run("head -c 20 /etc/shadow", lang="sh")  # host root owns it; the sandbox is not root
    assert r.exit_code != 0 and r.stdout == ""
    with pytest.raises(SandboxError, match="cannot reach the workspace"):
        Sandbox(tmp_path / "ws", FAST)  # pytest's tmp_path is 0700: refused with the fix, not at run


def test_default_workspace_is_fresh_and_reachable():
    if HOST.tier is None:
        pytest.skip(f"this host lacks every sandbox tier: {HOST.reason}")
    a, b = Sandbox(limits=FAST), Sandbox(limits=FAST)
    try:
        assert a.workspace != b.workspace and a.workspace.parent == workspace_root()
        assert a.run("print(1)").stdout == "1\n"
    finally:
        shutil.rmtree(a.workspace)
        shutil.rmtree(b.workspace)


def test_probe_finds_tier_a_where_user_namespaces_work():
    """Guards against a regression in the sandbox's flags silently turning the battery into skips:
    where plain `unshare` can make the namespaces, the probe must find tier A."""
    unshare = shutil.which("unshare")
    if unshare is None or HOST.bwrap is None:
        pytest.skip("no unshare or no bubblewrap binary to compare the probe against")
    argv = [
        unshare,
        "--user",
        "--map-root-user",
        "--net",
        "--pid",
        "--ipc",
        "--uts",
        "--mount",
        "--fork",
        "true",
    ]
    if os.geteuid() == 0:  # as the uid the sandbox runs as
        argv = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", *argv]
    if subprocess.run(argv, capture_output=True).returncode != 0:
        pytest.skip("user namespaces do not work on this host: tier A is rightly unavailable")
    assert HOST.tier == "bwrap", HOST.reason
