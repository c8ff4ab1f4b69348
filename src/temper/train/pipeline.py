"""Where a step's batch comes from: sampled now (the lockstep loop), or by a worker up to k updates
ahead (`async_rollouts: {max_staleness: k}`, the schedule below).

The schedule is fixed, so a run is reproducible:

    the batch of step s (0-based) is sampled with version max(0, s - k)
    (version v: the weights after v updates; staleness min(s, k))

At the start of step t the trainer holds version t, hands the worker the job of step t + k with
those weights (the worker samples the jobs in step order), then waits for step t's batch, which
was handed over k steps earlier and sampled while the trainer trained steps t - k ... t - 1.
While the trainer updates, the worker samples: on a CPU the worker is a forked process with its
own copy of the model and one torch thread (the trainer keeps the other cores), so sampling and
training each get cores of their own (one thread, because the OpenMP pool torch's CPU build uses
does not survive a fork: a forked child at 2 threads hangs in its first parallel op, measured); a thread worker (for a CUDA model, which cannot be forked) shares
this process.

By default (`in_flight: finish`) a batch is sampled wholly with one version: an episode finishes
under the weights it started with, the deterministic choice. With `in_flight: continue` the worker
takes newer weights as soon as the trainer hands them over, between the rounds of the agent loop
(each round is the next turn of every live episode; a turn is never split): the episodes in flight
continue under them, every turn records the version that sampled it (`Sample.policy_version`),
and the PPO ratio of each token is against the logprob its own sampler gave. What a batch holds
then depends on timing, so a run is no longer reproducible byte for byte. Resuming at step s needs
the jobs s ... s + k - 1 again, with versions s - k ... s - 1: the weights of the last k versions
are kept (`versions`) and saved with every checkpoint, so a resumed run samples exactly what the
uninterrupted one did (with `continue`: starts them from the same weights).

Hand-written rather than a library's: the worker only runs temper's own `sample_share` for a step
with given weights; a process pool (concurrent.futures) cannot keep one model per worker and
swap its weights between jobs, and Ray (issue 27's `workers: ray`) is an optional extra.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from temper.rollout.sampler import model_of

__all__ = [
    "Drawn",
    "Inline",
    "Pipelined",
    "WorkerError",
    "in_flight_metrics",
    "serve_jobs",
    "version_of",
    "weights_of",
]


class WorkerError(RuntimeError):
    """The rollout worker failed (an exception while sampling a step, or the process died)."""


def version_of(step: int, k: int) -> int:
    """The weights version the batch of `step` (0-based) is sampled with: max(0, step - k)."""
    return max(0, step - k)


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of `model`'s state dict, on the CPU: what a job carries to the worker."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@dataclass
class Drawn:
    """A step's batch as `sample_share` returned it, and where it came from."""

    local: list[Any]
    causes: list[str | None]
    rounds: int
    failed: list[Any]
    graded: list[Any]
    version: int
    """The weights version it was sampled with (the rollouts' policy version)."""
    seconds: float
    """The sampling's own time (the worker's, for a pipelined batch)."""
    waited: float = 0.0
    """How long the trainer waited for it (0 for an inline batch: its time is `seconds`)."""


SampleStep = Callable[[Any, int, list[Any]], tuple[list[Any], list[str | None], int, list[Any]]]
"""(the sampler, step, a list that receives every graded group) -> `sample_share`'s (groups,
causes, rounds, failed)."""


def _sample(sample_step: SampleStep, sampler: Any, step: int, version: int) -> Drawn:
    t0 = time.perf_counter()
    graded: list[Any] = []
    local, causes, rounds, failed = sample_step(sampler, step, graded)
    return Drawn(local, causes, rounds, failed, graded, version, time.perf_counter() - t0)


class Inline:
    """k = 0: each step's batch sampled when the step asks for it, with the current weights."""

    max_staleness = 0
    owns_engine = False
    """Whether the worker syncs the sampler (`Pipelined.owns_engine`): never inline."""

    def __init__(self, sample_step: SampleStep, sampler: Any):
        self.sample_step, self.sampler = sample_step, sampler

    def take(self, step: int, model: torch.nn.Module) -> Drawn:
        return _sample(self.sample_step, self.sampler, step, step)

    def close(self) -> None:
        pass


def in_flight_metrics(step: int, groups: list[Any]) -> dict[str, float]:
    """Of a batch sampled with `in_flight: continue` (step 0-based): `async/swapped_share`, the
    share of episodes whose turns were sampled by more than one weights version, and
    `async/token_staleness`, the mean over policy tokens of the updates between the version that
    sampled a token and `step`."""
    episodes = [r.trajectory for g in groups for r in g.rollouts]
    turns = [(s.policy_version, len(s.token_ids)) for t in episodes for s in t.segments if s.trainable]
    tokens = sum(n for v, n in turns if v is not None)
    return {
        "async/swapped_share": sum(len(set(t.policy_versions)) > 1 for t in episodes) / max(len(episodes), 1),
        "async/token_staleness": sum((step - v) * n for v, n in turns if v is not None) / max(tokens, 1),
    }


def _load(model: torch.nn.Module, base: Any, weights: Any) -> None:
    model.load_state_dict(pickle.loads(weights) if isinstance(weights, bytes) else weights)
    model.eval()
    base.sync(model)


class InFlight:
    """`in_flight: continue`: the worker's jobs, read ahead, and the weights it holds. Before each
    sampler call (each round of the agent loop: the next turn of every live episode) `poll`
    takes the jobs the trainer has handed over since, without waiting; a later job carries newer
    weights, which are loaded, so the episodes in flight continue under them. A job starts with
    its own weights or the newer ones already held, whichever is newer."""

    def __init__(self, jobs: Any, model: torch.nn.Module, base: Any):
        self.jobs, self.model, self.base = jobs, model, base
        self.ahead: deque[Any] = deque()  # jobs read ahead (a None: the stop, after them)
        self.version = -1  # the weights version the worker's model holds

    def poll(self) -> None:
        while True:
            try:
                self.ahead.append(self.jobs.get(block=False))
            except queue.Empty:
                break
        newest = max((j for j in self.ahead if j is not None), key=lambda j: j[1], default=None)
        if newest is not None and newest[1] > self.version:
            _load(self.model, self.base, newest[2])
            self.version = newest[1]

    def next_job(self) -> Any:
        return self.ahead.popleft() if self.ahead else self.jobs.get()

    def start(self, version: int, weights: Any) -> int:
        if version > self.version:
            _load(self.model, self.base, weights)
            self.version = version
        return self.version


class Tagged:
    """The worker's sampler under `in_flight: continue`: polls for newer weights before each call
    and tags every sample with the version that drew it (the agent loop copies it into the
    episode's segment)."""

    def __init__(self, sampler: Any, in_flight: InFlight):
        self._sampler, self._in_flight = sampler, in_flight

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        self._in_flight.poll()
        out = self._sampler.sample(*args, **kwargs)
        for row in out:
            for s in row:
                s.policy_version = self._in_flight.version
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


def serve_jobs(
    jobs: Any,
    results: Any,
    model: torch.nn.Module,
    base: Any,
    sampler: Any,
    sample_step: SampleStep,
    in_flight: str = "finish",
) -> None:
    """The worker's loop: load a job's weights into its model (which `base`, the sampler under the
    features' wrapper `sampler`, reads), sample the step, send the batch. With `in_flight:
    continue` newer weights are taken between the rounds of a batch (`InFlight`)."""
    ahead = InFlight(jobs, model, base) if in_flight == "continue" else None
    tagged = Tagged(sampler, ahead) if ahead is not None else sampler
    while (job := (ahead.next_job() if ahead is not None else jobs.get())) is not None:
        step, version, weights = job
        try:
            if ahead is not None:
                version = ahead.start(version, weights)
            else:
                _load(model, base, weights)
            results.put(("ok", step, _sample(sample_step, tagged, step, version)))
        except BaseException as e:  # reported to the trainer, which raises it there
            line = f"{type(e).__name__}: {e}"
            results.put(("error", step, (line, traceback.format_exc())))


def _serve_process(jobs: Any, results: Any, *args: Any) -> None:
    torch.set_num_threads(1)  # never more in a forked child: the parent's OpenMP pool is not its own
    results.cancel_join_thread()  # abandoned at close: a batch nobody reads must not keep the worker alive
    serve_jobs(jobs, results, *args)


class Pipelined:
    """k > 0: a worker samples the jobs of steps t + 1 ... t + k while the trainer trains step t.

    `model` and `sampler` are the worker's: in a process worker the forked copies of the
    trainer's (the child process gets its own copy at fork time), in a thread worker a copy
    this class makes. `versions` are the kept weights of a resumed run (`Pipelined.versions`).
    """

    def __init__(
        self,
        k: int,
        sample_step: SampleStep,
        model: torch.nn.Module,
        sampler: Any,
        *,
        start: int = 0,
        last: int,
        versions: dict[int, dict[str, torch.Tensor]] | None = None,
        worker: str = "process",
        wrap: Callable[[Any], Any] = lambda s: s,
        in_flight: str = "finish",
    ):
        """`wrap` turns the worker's base sampler into the one it samples with (the features'
        wrapper, e.g. AdaptThink's forced first token)."""
        if k < 1:
            raise ValueError(f"max_staleness {k}: a pipeline needs k >= 1 (0 is the inline loop)")
        self.k, self.next, self.last = k, start, last
        self.max_staleness = k
        self._kept: deque[tuple[int, dict[str, torch.Tensor]]] = deque(
            sorted((versions or {}).items()), maxlen=k
        )
        self._trainer_threads = torch.get_num_threads()
        self._process = worker == "process"
        self.owns_engine = False
        """True for a thread worker over an engine sampler (vLLM): it syncs each job's weights into
        the engine it shares with the trainer's sampler, which the trainer then leaves alone."""
        if worker == "process":
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                raise WorkerError(
                    "a process worker forks, which CUDA forbids: use async_rollouts.worker: thread"
                )
            ctx = multiprocessing.get_context("fork")
            # Queues, not pipes: a job's weights are written by a feeder thread, so handing one over
            # never waits for the worker to finish the batch it is sampling
            self._jobs, self._results = ctx.Queue(), ctx.Queue()
            # the child inherits the model, the sampler and every object `sample_step` reads as they are
            # now: its own copies, which only the jobs' weights change afterwards
            self._worker: Any = ctx.Process(
                target=_serve_process,
                args=(self._jobs, self._results, model, sampler, wrap(sampler), sample_step, in_flight),
                daemon=True,
                name="temper-rollouts",
            )
            self._worker.start()
            torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
        elif worker == "thread":
            own = copy.deepcopy(model).eval()
            base = copy.copy(sampler)  # the trainer's sampler keeps its model; this one reads `own`
            base.sync(own)
            # an engine sampler (vLLM) holds weights of its own, which this copy shares: the worker
            # syncs each job's into it, so the trainer must not sync it after its updates
            self.owns_engine = model_of(sampler) is None
            self._jobs, self._results = queue.SimpleQueue(), queue.SimpleQueue()
            self._worker = threading.Thread(
                target=serve_jobs,
                args=(self._jobs, self._results, own, base, wrap(base), sample_step, in_flight),
                daemon=True,
            )
            self._worker.start()
        else:
            raise ValueError(f"unknown worker {worker!r}: process | thread")

    def _carry(self, weights: dict[str, torch.Tensor]) -> Any:
        """A job's weights as they cross to the worker: pickled bytes for a process (through
        multiprocessing's pickler torch would share the tensors' memory by passing file
        descriptors, from a thread that then lives as long as this process), as they are for a thread."""
        return pickle.dumps(weights) if self._process else weights

    def take(self, step: int, model: torch.nn.Module) -> Drawn:
        """The batch of `step`, whose trainer now holds version `step` (`model`); first hands over
        the jobs through step + k (the current version's, and a resumed run's kept ones)."""
        current = weights_of(model)
        kept = dict(self._kept)
        while self.next <= min(step + self.k, self.last):
            version = version_of(self.next, self.k)
            weights = current if version == step else kept.get(version)
            if weights is None:
                raise WorkerError(
                    f"step {self.next + 1} needs the weights of version {version}, which were not kept"
                )
            self._jobs.put((self.next, version, self._carry(weights)))
            self.next += 1
        if not self._kept or self._kept[-1][0] != step:
            self._kept.append((step, current))
        t0 = time.perf_counter()
        while True:
            try:
                status, got, payload = self._results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._worker.is_alive():
                    code = getattr(self._worker, "exitcode", None)
                    raise WorkerError(
                        f"the rollout worker died (exit code {code}) before step {step + 1}'s batch"
                    ) from None
        if status == "error":
            line, trace = payload
            raise WorkerError(f"the rollout worker failed on step {got + 1}: {line}\n{trace}")
        if got != step:
            raise WorkerError(f"the rollout worker returned step {got + 1} where step {step + 1} was due")
        payload.waited = time.perf_counter() - t0
        return payload

    def versions(self) -> dict[int, dict[str, torch.Tensor]]:
        """The kept weights a resume after the current step needs (the last k versions)."""
        return dict(self._kept)

    def close(self) -> None:
        """Stop the worker (a job in flight is abandoned) and give the trainer its threads back."""
        if self._worker is None:
            return
        self._jobs.put(None)
        self._worker.join(timeout=5.0)
        if isinstance(self._worker, multiprocessing.process.BaseProcess):
            if self._worker.is_alive():
                self._worker.kill()
                self._worker.join(timeout=5.0)
            for q in (self._jobs, self._results):
                q.cancel_join_thread()
                q.close()
        torch.set_num_threads(self._trainer_threads)
        self._worker = None
