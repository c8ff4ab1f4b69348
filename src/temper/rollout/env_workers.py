"""Environments played in worker processes: a pool of local processes or of Ray actors.

    pool = open_pool("local", workers=2)          # or "ray" (address=None: a local Ray)
    envs_G_N = pool.place(envs_G_N)               # the same envs, each now a proxy of one in a worker
    run_episodes(sampler, tokenizer, envs_G_N, seeds, limits)
    pool.close()

Why: an env's `step` and a task's reward functions run in the trainer's process, in threads
(`temper.guard`), which is right while they wait on a subprocess (the sandbox) but not for ones
that compute in Python (the GIL serialises them with the trainer), nor for a cluster, where
environments live on other machines. Here every env of a group is pickled to one worker (a
group's envs share their task, so it is pickled once per group), played there, and its calls
come back as the same values: a seeded run equals the in-process one (tests/test_env_workers.py).

The agent loop does not change: `place` gives it proxies (`RemoteEnv`) with the env's members
(`stop`, `tools`, `label`, `describe`, `step_batch` for a batched env) and a `cut` / `close` each,
its end of episode (the worker then lets the env go), which it calls as user code, under the same time limits, in the same guard threads. So failures read as they did in
process: a worker sends back an exception's last line and the user's file:line
(`guard.RaisedElsewhere`), never a traceback; a call past its limit is abandoned by the loop as
before (it runs on in its worker's daemon thread, and the worker goes on serving the others); a
worker that dies fails its pending and later calls with one line, never a hang. Batched envs
(`TaskEnv`: one `grade_batch` per group, the reward functions) are graded in the worker that holds
the group, in one call. An env that cannot be pickled ends its episode at reset as an env_error
saying so (`workers` off plays it in process).

Local workers are forked when the pool opens (the task's and the user's modules already
imported, so their classes unpickle by reference; a fresh interpreter would cost 1-2 s of imports
each). Ray actors (`pip install temper[ray]`; imported only here, when a pool of kind "ray"
opens) take `num_cpus=0`: they mostly wait, and actors that reserve CPUs on a small machine
starve Ray's other tasks. A pool shuts down the Ray it started, and only that one.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import sys
import threading
from collections.abc import Sequence
from typing import Any

from temper import guard
from temper.envs.base import (
    Closable,
    Cuttable,
    DescribesCalls,
    GradesSummaries,
    Labelled,
    StepsInBatch,
    context_of,
    tools_of,
)
from temper.tasks.reward_functions import MODULE_PREFIX

KINDS = ("local", "ray")
METHODS = ("reset", "step", "cut/close")
"""The method names a failure line may name (the agent loop's); a worker reports an env's
`describe` of each after every call, as the env's own words change when its episode starts."""
RAY_HINT = "pip install temper[ray]"
ASK_S = 5.0
"""Seconds a proxy waits for its worker to say what a failed call was (then: what it said last)."""


class WorkerError(RuntimeError):
    """A pool that cannot start or serve (one line)."""


# ---- the worker side: what a local worker process or a Ray actor runs -------------------------


class EnvHost:
    """The envs a worker holds, by key, and the calls on them. Every method returns a reply, never
    raises: ("ok", value, describes) | ("raised", last line, user frame) | ("failure", line, kind)."""

    def __init__(self, timeout: float | None = None):
        self.envs: dict[int, Any] = {}
        if timeout is not None:  # a Ray actor is a fresh process: user code gets the stage's limit
            guard.time_limit(timeout).__enter__()

    def place(self, keyed: list[tuple[int, Any]]) -> tuple:
        self.envs.update(keyed)
        return ("ok", [_describes(env) for _, env in keyed], None)

    def call(self, key: int, method: str, args: tuple) -> tuple:
        env = self.envs.get(key)
        try:
            if method == "close":  # cut and close as the loop asks them, then the env is let go
                self.envs.pop(key, None)
                reason = args[0] if args else None
                signals = dict(env.cut(reason) or {}) if reason and isinstance(env, Cuttable) else {}
                if isinstance(env, Closable):
                    env.close()
                value = signals
            else:
                value = getattr(env, method)(*args)
        except BaseException as err:  # SystemExit included, as guard.run_all does
            return _reply_error(err)
        return _sendable(("ok", value, _describes(env)))

    def describe(self, key: int, method: str) -> tuple:
        """What the env says of a call of `method` now (asked when a call failed or hung: an env's
        words change as its episode starts, during the call that hung too)."""
        known = _describes(self.envs.get(key)) or {}
        return ("ok", known.get(method), None)

    def held(self) -> tuple:
        """How many envs this worker holds (each is let go when its episode is closed)."""
        return ("ok", len(self.envs), None)

    def batch(self, keys: list[int], actions: list[str], ids: list[list[int]]) -> tuple:
        envs = [self.envs[k] for k in keys]
        try:
            results = type(envs[0]).step_batch(envs, actions, ids)
        except BaseException as err:
            return _reply_error(err)
        return _sendable(("ok", results, None))


def _describes(env: Any) -> dict[str, str] | None:
    if not (isinstance(env, DescribesCalls) and callable(env.describe)):
        return None
    try:
        return {m: env.describe(m) for m in METHODS}
    except Exception:
        return None


def _reply_error(err: BaseException) -> tuple:
    if isinstance(err, guard.UserCodeFailure):
        return ("failure", err.line, err.kind)
    return ("raised", guard.last_line(err), guard.user_frame(err))


def _sendable(reply: tuple) -> tuple:
    """`reply`, or what it says when its value cannot be pickled back."""
    try:
        pickle.dumps(reply)
    except Exception as err:
        return (
            "raised",
            f"a value that cannot be sent back from a worker process ({guard.last_line(err)})",
            None,
        )
    return reply


def _serve(conn: Any) -> None:
    """A local worker process: each request in a daemon thread of its own (a hung call holds only
    its thread), replies sent under a lock; ends when the pool closes or goes away."""
    host, lock = EnvHost(), threading.Lock()

    def run(i: int, op: str, args: tuple) -> None:
        reply = getattr(host, op)(*args)
        with lock:
            try:
                conn.send((i, reply))
            except (OSError, ValueError):
                pass

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        threading.Thread(target=run, args=msg, name=f"{guard.THREAD_PREFIX}:worker", daemon=True).start()
    os._exit(0)  # abandoned calls' threads are not waited for


# ---- the trainer side ------------------------------------------------------------------------


class Pool:
    """Workers that hold envs; `request(worker, op, *args)` -> the worker's reply (blocking)."""

    size: int

    def __init__(self) -> None:
        self._keys = itertools.count()
        self._next = 0

    def request(self, worker: int, op: str, *args: Any, timeout: float | None = None) -> tuple:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def place(self, envs_G_N: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Each group's envs sent to one worker (round robin), as proxies. An env that cannot be
        sent becomes one whose reset fails saying so (the loop ends its episode as an env_error)."""
        out = []
        for group in envs_G_N:
            worker, self._next = self._next, (self._next + 1) % self.size
            keyed = [(next(self._keys), env) for env in group]
            try:
                reply = self.request(worker, "place", keyed, timeout=guard.timeout_s())
            except Exception as err:
                reply = ("raised", guard.last_line(err), None)
            if reply[0] != "ok":
                line = (
                    f"cannot run in a worker process: {reply[1]} (train.workers off plays it in this process)"
                )
                out.append([_Unsent(env, line) for env in group])
                continue
            out.append(
                [_proxy(env)(self, worker, k, env, d) for (k, env), d in zip(keyed, reply[1], strict=True)]
            )
        return out


class LocalPool(Pool):
    """`workers` forked processes, each serving over a pipe; a reader thread per worker hands the
    replies to the calls that wait for them."""

    def __init__(self, workers: int):
        super().__init__()
        self.size = workers
        ctx = multiprocessing.get_context("fork")
        self._lock = threading.Lock()
        self._pending: dict[int, list[Any]] = {}  # request -> [event, reply, worker]
        self._ids = itertools.count()
        self._conns, self._procs, self._readers, self._dead = [], [], [], [None] * workers
        for w in range(workers):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs,), name=f"temper-env-worker-{w}", daemon=True)
            proc.start()
            theirs.close()
            reader = threading.Thread(
                target=self._read, args=(w, mine), name=f"temper-env-reader-{w}", daemon=True
            )
            reader.start()
            self._conns.append(mine)
            self._procs.append(proc)
            self._readers.append(reader)

    def _read(self, w: int, conn: Any) -> None:
        while True:
            try:
                i, reply = conn.recv()
            except (EOFError, OSError, TypeError):
                break
            with self._lock:
                slot = self._pending.pop(i, None)
            if slot is not None:
                slot[1] = reply
                slot[0].set()
        code = self._procs[w].exitcode if w < len(self._procs) else None
        self._fail(w, f"worker process {w} exited" + (f" (exit code {code})" if code else ""))

    def _fail(self, w: int, line: str) -> None:
        with self._lock:
            self._dead[w] = self._dead[w] or line
            lost = [i for i, slot in self._pending.items() if slot[2] == w]
            slots = [self._pending.pop(i) for i in lost]
        for slot in slots:
            slot[1] = ("raised", self._dead[w], None)
            slot[0].set()

    def request(self, worker: int, op: str, *args: Any, timeout: float | None = None) -> tuple:
        i, slot = next(self._ids), [threading.Event(), None, worker]
        with self._lock:
            if self._dead[worker]:
                return ("raised", self._dead[worker], None)
            self._pending[i] = slot
            try:
                self._conns[worker].send((i, op, args))
            except OSError:  # the worker is gone (its reader may not have seen it yet)
                self._pending.pop(i, None)
                self._dead[worker] = f"worker process {worker} exited"
                return ("raised", self._dead[worker], None)
            except Exception:  # what cannot be pickled: the caller says so
                self._pending.pop(i, None)
                raise
        if not slot[0].wait(timeout):
            with self._lock:
                self._pending.pop(i, None)
            return ("raised", f"worker process {worker} did not answer within {timeout:g} s", None)
        return slot[1]

    def close(self) -> None:
        for conn in self._conns:
            with self._lock:
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass
        for proc in self._procs:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        for w, conn in enumerate(self._conns):
            conn.close()
            self._fail(w, "the worker pool is closed")
        for reader in self._readers:
            reader.join(2)


class RayPool(Pool):
    """`actors` Ray actors (threaded, `num_cpus=0`) on the Ray at `address`, or on a local one it
    starts (and shuts down) when none is running."""

    def __init__(self, actors: int, address: str | None = None):
        super().__init__()
        ray = import_ray()
        self.size, self._ray, self._started, self._by_value = actors, ray, False, set()
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
            self._started = True
        # the driver's import path, so the actors import what its envs' classes name (a test's or
        # a project's modules); on a cluster, ship them with Ray's own runtime_env
        path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        host = ray.remote(num_cpus=0, max_concurrency=64)(EnvHost)
        options = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}}
        self._actors = [host.options(**options).remote(guard.timeout_s()) for _ in range(actors)]

    def place(self, envs_G_N: Sequence[Sequence[Any]]) -> list[list[Any]]:
        # modules a recipe names by file are loaded under generated names no actor can import:
        # their classes and functions travel by value
        for name, module in list(sys.modules.items()):
            if name.startswith(MODULE_PREFIX) and name not in self._by_value:
                self._ray.cloudpickle.register_pickle_by_value(module)
                self._by_value.add(name)
        return super().place(envs_G_N)

    def request(self, worker: int, op: str, *args: Any, timeout: float | None = None) -> tuple:
        ray = self._ray
        ref = getattr(self._actors[worker], op).remote(*args)
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            return ("raised", f"Ray actor {worker} did not answer within {timeout:g} s", None)
        except ray.exceptions.RayError as err:  # its message holds a traceback: the cause's line only
            said = guard.last_line(getattr(err, "cause", None) or err).split(" traceback:")[0]
            return ("raised", f"Ray actor {worker} failed: {said[:300]}", None)

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._started:
            self._ray.shutdown()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise WorkerError(f"train.workers kind 'ray' needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def open_pool(kind: str, workers: int, address: str | None = None) -> Pool:
    if kind == "local":
        return LocalPool(workers)
    if kind == "ray":
        return RayPool(workers, address)
    raise ValueError(f"unknown worker kind {kind!r}: one of {', '.join(KINDS)}")


# ---- the proxies the agent loop plays --------------------------------------------------------


class RemoteEnv:
    """An env held by a worker, with the members the agent loop reads; each call is one request."""

    def __init__(self, pool: Pool, worker: int, key: int, env: Any, describes: dict[str, str] | None):
        self._pool, self._worker, self._key = pool, worker, key
        self.stop = tuple(env.stop)
        self.tools = tools_of(env)
        self.context_budget = context_of(env)
        self.label = (env.label if isinstance(env, Labelled) else None) or type(env).__name__
        self._describes = describes

    def describe(self, method: str) -> str:
        """The env's own words when it has some (asked of the worker now, as the loop asks this only
        when a call failed or hung: then the env may be past what the last reply said), else its label's."""
        if self._describes is not None:
            reply = self._pool.request(self._worker, "describe", self._key, method, timeout=ASK_S)
            if reply[0] == "ok" and reply[1]:
                return reply[1]
        known = self._describes or {}
        return known.get(method) or f"env {self.label}.{method}"

    def _call(self, method: str, *args: Any) -> Any:
        return self._unpack(self._pool.request(self._worker, "call", self._key, method, args))

    def _unpack(self, reply: tuple) -> Any:
        status, value, extra = reply
        if status == "failure":
            raise guard.UserCodeFailure(value, extra)
        if status == "raised":
            raise guard.RaisedElsewhere(value, extra)
        if extra is not None:
            self._describes = extra
        return value

    def reset(self) -> Any:
        return self._call("reset")

    def step(self, action: str) -> Any:
        return self._call("step", action)


class _Closing:
    """The end of a proxy's episode. The loop calls `cut` (when it ended a sound episode) and then
    `close`: the worker does both in the first of them, as one request, and lets the env go (its
    `cut` and `close` run there only when the env has them)."""

    _closed = False

    def cut(self, reason: str) -> dict[str, Any]:
        self._closed = True
        return self._call("close", reason)  # type: ignore[attr-defined]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call("close", None)  # type: ignore[attr-defined]


def _batched() -> Any:
    def step_batch(
        envs: Sequence[RemoteEnv], actions: Sequence[str], ids: Sequence[Sequence[int]]
    ) -> list[Any]:
        """The group's envs graded in their worker in one call (a group never spans workers)."""
        first = envs[0]
        keys = [e._key for e in envs]
        limit = guard.timeout_s() * 2  # the worker's own reward-function limits come first
        reply = first._pool.request(
            first._worker, "batch", keys, list(actions), [list(i) for i in ids], timeout=limit
        )
        return first._unpack(reply)

    return staticmethod(step_batch)


_CLASSES: dict[tuple, type] = {}


def _proxy(env: Any) -> type:
    """The proxy class for `env`: a class per (env class, batched), named as the env's, so the
    loop's batching by class and its failure lines see what they saw in process. Every proxy
    can be cut and closed, whether or not its env can: the loop's `close` is how the worker learns
    an episode is over and lets its env go (an env it cannot cut gives no signals, as in process)."""
    batched = isinstance(env, StepsInBatch)
    grades = isinstance(env, GradesSummaries)
    key = (type(env), batched, grades)
    if key not in _CLASSES:
        members: dict[str, Any] = {"__module__": __name__}
        if grades:  # the loop grades each self-summary in the env's worker
            members["summary_reward"] = lambda self, text: self._call("summary_reward", text)
        if batched:
            members["step_batch"] = _batched()
            members["batch_across_groups"] = False  # a call per worker group, never across workers
        _CLASSES[key] = type(type(env).__name__, (_Closing, RemoteEnv), members)
    return _CLASSES[key]


class _Unsent:
    """An env that could not be sent to a worker: its reset fails with `line` (an env_error)."""

    def __init__(self, env: Any, line: str):
        self.stop = tuple(getattr(env, "stop", ()))
        self.label = (env.label if isinstance(env, Labelled) else None) or type(env).__name__
        self._line = line

    def reset(self) -> Any:
        raise guard.UserCodeFailure(f"env {self.label} {self._line}", "raised")

    def step(self, action: str) -> Any:
        return self.reset()
