"""User code under a time limit, its failure told in one line: how temper calls what a recipe names.

User code is what the recipe names by `module:function` or by command: reward functions (sync and
async), environment factories and the envs they return (`reset`, `step`, `cut`, `close`), TRL
environment classes, gymnasium / OpenEnv envs, MCP servers and judge endpoints. Every call of it

- runs under a time limit (`timeout_s()`: `DEFAULT_TIMEOUT_S` unless a stage sets another with
  `time_limit`, as the RL stage does from `train.user_code.timeout`);
- fails as a `UserCodeFailure`, whose message is one line: what failed (`reward function
  rewards.py:score`), on what (`on problem rows.jsonl:3`), how (`ValueError: my reward blew up`,
  the exception's last line, or `did not return within 60 s`) and where in the user's own file
  (`at rewards.py:12`).

What a run then does (stop, count, go on) is the caller's policy (`temper.train.user_code`); this
module only calls, times and describes.

Why daemon threads and not worker processes: Python cannot stop a running thread, so a call past
its time limit is abandoned, not killed: it runs on in its daemon thread, harmless, until it
returns or the process exits, and the caller goes on at once. A worker process could be killed,
but every env and reward function would have to be pickled into it with its state (an env keeps
its episode between steps, a TRL env class its live instance), and a fresh Python process costs
1-2 s of imports: far more than the calls, which take microseconds. Code that must be killed, a
model's actions and generated programs, runs in `temper.sandbox`. A run that wants its envs and graders in
other processes anyway (Python-heavy ones, a cluster) asks for `train.workers`
(`temper.rollout.env_workers`), whose workers call them under these same rules and send back
what a failure's line needs (`RaisedElsewhere`). (Not a `ThreadPoolExecutor`:
its workers are joined at interpreter exit, so one hung call would hang the process's exit.)
"""

from __future__ import annotations

import builtins
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DEFAULT_TIMEOUT_S = 60.0
"""Seconds one call of user code may take unless a stage says otherwise."""
THREAD_PREFIX = "temper-user-code"
"""The name of every thread user code runs in (a test can find the ones a hung call left)."""
MAX_LINE = 400
"""Characters of an exception's message kept in the line."""

_timeout = [DEFAULT_TIMEOUT_S]
_GROUPS = getattr(
    builtins, "BaseExceptionGroup", ()
)  # Python 3.11's exception groups (anyio's, the MCP SDK's)


def timeout_s() -> float:
    """The time limit of one call of user code now (seconds)."""
    return _timeout[0]


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Calls of user code made inside (from any thread) get `seconds` each. Process-wide, not per
    thread: user code is called from worker threads too, and a process runs one stage at a time."""
    if not seconds > 0:
        raise ValueError(f"a time limit must be > 0 seconds, got {seconds}")
    before, _timeout[0] = _timeout[0], float(seconds)
    try:
        yield
    finally:
        _timeout[0] = before


class UserCodeError(Exception):
    """User code failed so that the run cannot go on. The message is one line naming the code;
    `hint`, when given, is the way out (the CLI prints it on a line of its own)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __reduce__(self) -> Any:  # (handed between processes by `distributed.on_main`)
        return type(self), (str(self), self.hint)


Kind = Literal["raised", "timeout", "returned"]


class UserCodeFailure(UserCodeError):
    """One call of user code that raised (`kind` "raised", `error` the exception), ran past its
    time limit ("timeout") or returned what it must not ("returned"). `str()` is the line."""

    def __init__(self, line: str, kind: Kind, error: BaseException | None = None):
        super().__init__(line)
        self.line, self.kind, self.error = line, kind, error

    def __repr__(self) -> str:
        return f"UserCodeFailure({self.line!r})"

    def __reduce__(self) -> Any:  # the exception itself may not pickle: its line says what it was
        return type(self), (self.line, self.kind)


class RaisedElsewhere(Exception):
    """An exception user code raised in another process (a worker of `temper.rollout.env_workers`),
    as what its line needs: its last line (`said`) and the user's frame (`at`). The exception itself
    may not pickle, and its traceback never crosses; `raised` describes this one as it would have
    described the original in this process."""

    def __init__(self, said: str, at: str | None = None):
        super().__init__(said)
        self.said, self.at = said, at

    def __reduce__(self) -> Any:
        return type(self), (self.said, self.at)


def _on(context: str) -> str:
    return f" on {context}" if context else ""


def raised(err: BaseException, what: str, context: str = "") -> UserCodeFailure:
    """The failure of user code `what` that raised `err` (a failure already described is kept)."""
    if isinstance(err, UserCodeFailure):
        return err
    at = user_frame(err)
    line = f"{what} raised{_on(context)}: {last_line(err)}" + (f" (at {at})" if at else "")
    return UserCodeFailure(line, "raised", err)


def timed_out(what: str, seconds: float, context: str = "") -> UserCodeFailure:
    return UserCodeFailure(f"{what} did not return within {seconds:g} s{_on(context)}", "timeout")


def returned(what: str, detail: str, context: str = "") -> UserCodeFailure:
    """`detail` says what came back and what was expected ("int, not a list of messages")."""
    return UserCodeFailure(f"{what} returned {detail}{_on(context)}", "returned")


def last_line(err: BaseException) -> str:
    """What a traceback's last line says of `err` (`ValueError: my reward blew up`), as one line
    and without the class's module; an exception group's leaves, each so, joined by '; '."""
    if isinstance(err, RaisedElsewhere):
        return err.said
    leaves = getattr(err, "exceptions", None)
    if isinstance(err, _GROUPS) and leaves:
        return "; ".join(dict.fromkeys(last_line(e) for e in leaves))
    said = str(err)  # the class by its own name: a user module's is loaded under a generated one
    text = " ".join(f"{type(err).__name__}: {said}".split()) if said.strip() else type(err).__name__
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def _library_dirs() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    here = Path(__file__).resolve().parent  # temper itself
    return (here, *(Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")))


def user_frame(err: BaseException) -> str | None:
    """`file.py:line` of the innermost frame of `err`'s traceback that is the user's own code:
    not temper, not the standard library, not an installed package (None when there is none)."""
    while isinstance(err, _GROUPS) and err.exceptions:
        err = err.exceptions[0]
    if isinstance(err, RaisedElsewhere):
        return err.at
    libraries = _library_dirs()
    found = None
    for frame, line in traceback.walk_tb(err.__traceback__):
        name = frame.f_code.co_filename
        if name.startswith("<"):
            continue
        path = Path(name).resolve()
        if not any(path.is_relative_to(d) for d in libraries):
            found = f"{path.name}:{line}"
    return found


@dataclass
class Done:
    """How one call ended: its `value`, or the exception it raised (`error`), or neither when it
    ran past its time limit (`timed_out`); `seconds` it took (the limit when it timed out)."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


def run_all(
    calls: Sequence[Callable[[], Any]], timeout: float | None = None, workers: int = 16, name: str = ""
) -> list[Done]:
    """Run every call, at most `workers` at a time, each in a daemon thread of its own with
    `timeout` seconds (default `timeout_s()`) from its own start; -> one `Done` per call, in
    order. A call past its limit is abandoned (module docstring) and gives its place to the next,
    so hung calls never starve the others; waiting is interruptible (Ctrl-C stops the caller)."""
    limit = timeout_s() if timeout is None else timeout
    out: list[Done | None] = [None] * len(calls)
    running: dict[int, float] = {}  # call -> its start (monotonic)
    cond = threading.Condition()

    def body(i: int) -> None:
        t0 = time.perf_counter()
        try:
            done = Done(value=calls[i]())
        except BaseException as err:  # SystemExit included: user code never ends the run this way
            done = Done(error=err)
        done.seconds = time.perf_counter() - t0
        with cond:
            if out[i] is None:  # not already given up on
                out[i] = done
                running.pop(i, None)
            cond.notify_all()

    following = 0
    with cond:
        while True:
            while len(running) < max(1, workers) and following < len(calls):
                running[following] = time.monotonic()
                label = f"{THREAD_PREFIX}:{name}" if name else THREAD_PREFIX
                threading.Thread(target=body, args=(following,), name=label, daemon=True).start()
                following += 1
            if not running:
                break
            now = time.monotonic()
            for i, start in list(running.items()):
                if now - start >= limit:
                    out[i] = Done(timed_out=True, seconds=limit)
                    del running[i]
            if running:
                cond.wait(min(start + limit for start in running.values()) - now)
    return [d if d is not None else Done(timed_out=True, seconds=limit) for d in out]


def call(
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    context: str = "",
    timeout: float | None = None,
    **kwargs: Any,
) -> Any:
    """`fn(*args, **kwargs)` under a time limit (default `timeout_s()`), in a daemon thread: its
    value, or a `UserCodeFailure` naming `what` (e.g. "reward function rewards.py:score") and
    `context` (e.g. "problem rows.jsonl:3")."""
    limit = timeout_s() if timeout is None else timeout
    [done] = run_all([lambda: fn(*args, **kwargs)], limit, 1, what)
    if done.timed_out:
        raise timed_out(what, limit, context)
    if done.error is not None:
        raise raised(done.error, what, context) from done.error
    return done.value


def user_threads() -> list[threading.Thread]:
    """The threads user code runs in now (those a hung call left included)."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]
