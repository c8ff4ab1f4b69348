"""A local HTTP server as a child process that temper owns: started on a free port of 127.0.0.1 in
its own process group, waited on until its health URL answers, and stopped (SIGTERM to the group,
SIGKILL after a grace period) by `stop()`, at interpreter exit (atexit, which also runs after an
uncaught KeyboardInterrupt) and, on Linux, when this process dies without running either (the
child is started with PR_SET_PDEATHSIG). Its output goes to a log file whose tail every error
quotes. Used by `VLLMServerSampler` (vllm_server.py); it knows nothing of vLLM.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 20
STOP_GRACE_S = 30.0


class ServerStartError(RuntimeError):
    """The server exited, or did not answer its health URL in time, while starting."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Requests to 127.0.0.1 must not go through an http_proxy of the environment.
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _libc_prctl() -> Any:
    """libc's prctl, looked up here (not in the forked child, where loading a library could wait
    on a lock another thread of this process held at the fork); None off Linux."""
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM it when its parent dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG


class ServerProcess:
    """argv run with `env`, its stdout and stderr in `log`, until `stop()`.

    ready_url: polled (GET, 200) every `poll_s` until it answers; `ready_timeout` seconds without
    an answer, or the process exiting first, raises `ServerStartError` with the log's tail, and
    the process (group) is stopped."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log: str | os.PathLike,
        ready_url: str,
        ready_timeout: float,
        poll_s: float = 0.5,
        what: str = "server",
    ):
        self.argv, self.log, self.what = list(argv), Path(log), what
        self._log_file = open(self.log, "ab")  # noqa: SIM115 (closed by stop)
        try:
            self.process = subprocess.Popen(
                self.argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped whole; Ctrl-C reaches temper only
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )
        except BaseException:
            self._log_file.close()
            raise
        atexit.register(self.stop)
        try:
            self._wait_ready(ready_url, ready_timeout, poll_s)
        except BaseException:  # a timeout, the child's exit, or Ctrl-C while waiting
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the log, for error messages."""
        try:
            text = self.log.read_bytes()[-64_000:].decode(errors="replace")
        except OSError as err:
            return f"(its log {self.log} cannot be read: {err})"
        return "\n".join(text.splitlines()[-lines:])

    def died(self) -> str:
        """One paragraph on a process that exited: its status, its log and the log's tail."""
        code = self.process.poll()
        how = (
            f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        )
        return f"the {self.what} (pid {self.pid}) {how}; the end of its log {self.log}:\n{self.log_tail()}"

    def _wait_ready(self, url: str, timeout: float, poll_s: float) -> None:
        start = time.monotonic()
        while True:
            if not self.alive():
                raise ServerStartError(f"{self.died()}")
            try:
                with LOCAL.open(url, timeout=max(poll_s, 5.0)) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet
            waited = time.monotonic() - start
            if waited > timeout:
                raise ServerStartError(
                    f"the {self.what} (pid {self.pid}) did not answer {url} within {timeout:g} s; "
                    f"the end of its log {self.log}:\n{self.log_tail()}"
                )
            time.sleep(poll_s)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM to the process group; SIGKILL to it after `grace` seconds, or once the leader
        has exited, to whatever of the group outlives it a few seconds (vLLM's engine core and
        worker stop on their SIGTERM). The leader is reaped last, so that its process group id
        cannot be reused by another while it is signalled. Idempotent."""
        atexit.unregister(self.stop)
        if self.process.returncode is None:
            self._signal(signal.SIGTERM)
            exited = self._wait_unreaped(grace)
            others = [p for p in group_members(self.pid) if p != self.pid]
            deadline = time.monotonic() + min(grace, 5.0)
            while exited and others and time.monotonic() < deadline:
                time.sleep(0.1)
                others = [p for p in group_members(self.pid) if p != self.pid]
            if not exited or others:
                self._signal(signal.SIGKILL)
            self.process.wait()
        self._log_file.close()

    def _wait_unreaped(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the leader to exit, leaving it a zombie (not reaped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:  # reaped elsewhere
                return True
            time.sleep(0.05)
        return False

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, read from /proc (Linux); [] where
    there is no /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members
