"""A discrete-event simulator of the RL loop's schedule: sync (k = 0) against asynchronous sampling
with bounded staleness k, predicted before any compute is spent (`temper simulate`; the inputs fitted to a run's logs
in `temper.train.pipeline_fit`).

What is modelled: the trainer and `workers` sampler workers, each doing work measured in seconds
it would take alone (`Pipeline`). Steps are numbered from 0; update t trains the batch of step t;
version v is the weights after v updates (update v-1 and its sync done). Two schedules:

- deterministic (`mode="deterministic"`): batch s is sampled with version max(0, s - k), so the
  staleness of update t's samples is t - max(0, s - k) = min(t, k) for every sample. A worker
  starts its share of batch s (episodes j with j % workers == w) once version max(0, s - k) exists
  and its share of batch s-1 is done; update t starts once batch t is complete and update t-1
  (with its sync) is done. k = 0 is today's lockstep loop: sample, grade, train, sync, repeat.
- as soon as possible (`mode="asap"`): episodes, not batches: a worker with a free slot starts a
  new episode with the newest version v whenever started - dropped < (v + k + 1) x batch, and
  update t trains the first `batch` finished episodes in order of completion. Short episodes
  finish first, so a batch over-represents them while long ones are still running; with
  `stale="drop"` an episode older than k versions at update t (t - version > k) is thrown away,
  and as long episodes are the ones that grow old the trained lengths are biased short for the
  whole run; with `stale="keep"` every episode is trained eventually (staleness may then exceed k).

Timing model (what `pipeline_fit.pipeline_from_run` measures in a run):
- an episode of L tokens is gen_per_token * L + gen_per_episode + env_per_episode +
  grade_per_episode seconds of its worker; a worker decodes up to `slots` episodes at once and
  shares its speed equally among them (processor sharing: batched decoding of a compute-bound
  sampler, where a batch of n costs n times one episode), so n episodes started together end in
  the order of their lengths and the last at the sum of their times;
- an update over N tokens is train_per_token * N + train_per_batch seconds, then `sync` seconds
  before the sampler has the new version (the trainer is busy meanwhile);
- `contention` >= 1: while the trainer and a sampler worker are both busy each runs that many times
  slower (two processes on a shared CPU); workers are assumed not to slow each other.
Episode lengths are drawn with `random.Random(seed)` from the measured lengths: draw i is the
length of episode i % batch of batch i // batch (deterministic) or of the i-th episode started
(asap), so schedules are compared on the same episodes and a prediction is a pure function of
its inputs."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["deterministic", "asap"]
Stale = Literal["keep", "drop"]


@dataclass(frozen=True)
class Pipeline:
    """The measured inputs of a prediction (seconds, tokens)."""

    prompts: int  # prompts per step
    group_size: int  # episodes per prompt; a batch is prompts x group_size episodes
    lengths: tuple[int, ...]  # measured completion lengths (tokens) the episodes are drawn from
    gen_per_token: float = 0.0  # sampler seconds per generated token
    gen_per_episode: float = 0.0  # sampler seconds per episode besides its tokens (prefill, overhead)
    env_per_episode: float = 0.0  # environment seconds per episode (tool calls, simulators)
    grade_per_episode: float = 0.0  # grading seconds per episode
    train_per_token: float = 0.0  # trainer seconds per trained completion token
    train_per_batch: float = 0.0  # trainer seconds per update besides its tokens
    sync: float = 0.0  # seconds to send the new weights to the sampler after each update
    workers: int = 1  # sampler workers
    slots: int | None = None  # episodes a worker decodes at once (None: a whole batch)
    contention: float = 1.0  # slowdown of trainer and sampler while both are busy (1: none)

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "workers"):
            _require(name, getattr(self, name), lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
        _require(
            "slots", self.slots, lambda v: v is None or (isinstance(v, int) and v >= 1), "an integer >= 1"
        )
        _require(
            "lengths",
            self.lengths,
            lambda v: len(v) > 0 and all(isinstance(x, int) and x >= 0 for x in v),
            "a non-empty list of integers >= 0",
        )
        for name in ("gen_per_token", "gen_per_episode", "env_per_episode", "grade_per_episode"):
            _require(name, getattr(self, name), _seconds, "a number of seconds >= 0")
        for name in ("train_per_token", "train_per_batch", "sync"):
            _require(name, getattr(self, name), _seconds, "a number of seconds >= 0")
        _require("contention", self.contention, lambda v: _seconds(v) and v >= 1, "a factor >= 1")

    @property
    def batch(self) -> int:
        return self.prompts * self.group_size


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _require(name: str, value: Any, ok: Any, what: str) -> None:
    if not ok(value):
        raise ValueError(f"{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class Schedule:
    """Which pipeline to simulate, for how many updates."""

    k: int = 0  # max staleness in versions (0: lockstep)
    mode: Mode = "deterministic"
    stale: Stale = "keep"  # asap only: train episodes older than k versions, or drop them
    steps: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        _require("k", self.k, lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
        _require("steps", self.steps, lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
        _require("mode", self.mode, lambda v: v in ("deterministic", "asap"), "deterministic or asap")
        _require("stale", self.stale, lambda v: v in ("keep", "drop"), "keep or drop")

    @property
    def label(self) -> str:
        if self.k == 0 and self.mode == "deterministic":
            return "sync"
        return f"k={self.k} " + ("det" if self.mode == "deterministic" else f"asap-{self.stale}")


@dataclass(frozen=True)
class Prediction:
    """What a simulated run did: when each update ended, and each trained sample's staleness and
    length, by update."""

    schedule: Schedule
    update_ends: tuple[float, ...]  # seconds from the start at which update t (and its sync) ended
    staleness: tuple[tuple[int, ...], ...]  # [t][i]: t - the version sample i of update t was drawn with
    lengths: tuple[tuple[int, ...], ...]  # [t][i]: its length in tokens
    generated: int  # episodes finished by the sampler by the end of the last update
    dropped: int  # of them, thrown away as too stale

    @property
    def seconds(self) -> float:
        return self.update_ends[-1]

    @property
    def steps_per_s(self) -> float:
        return len(self.update_ends) / self.seconds if self.seconds > 0 else math.inf

    @property
    def samples_per_s(self) -> float:
        """Trained samples per second (dropped ones do not count)."""
        return sum(map(len, self.lengths)) / self.seconds if self.seconds > 0 else math.inf

    @property
    def steady_seconds_per_step(self) -> float:
        """Seconds per update over the second half of the run, past the pipeline's warm-up:
        (end[T-1] - end[h]) / (T-1-h), h = T // 2 (the whole run's mean when T < 3)."""
        ends, h = self.update_ends, len(self.update_ends) // 2
        return (ends[-1] - ends[h]) / (len(ends) - 1 - h) if len(ends) >= 3 else self.seconds / len(ends)

    @property
    def mean_staleness(self) -> float:
        return statistics.fmean(s for row in self.staleness for s in row)

    @property
    def max_staleness(self) -> int:
        return max(s for row in self.staleness for s in row)

    @property
    def mean_length(self) -> float:
        """Mean length of the trained samples (the length bias, against sync's)."""
        return statistics.fmean(n for row in self.lengths for n in row)


def episode_seconds(p: Pipeline, tokens: int) -> float:
    """Worker seconds of one episode alone: gen_per_token * tokens + gen_per_episode +
    env_per_episode + grade_per_episode."""
    return p.gen_per_token * tokens + p.gen_per_episode + p.env_per_episode + p.grade_per_episode


def update_seconds(p: Pipeline, tokens: int) -> float:
    """Trainer seconds of one update over `tokens` trained tokens, its sync included:
    train_per_token * tokens + train_per_batch + sync."""
    return p.train_per_token * tokens + p.train_per_batch + p.sync


def sampling_version(step: int, k: int) -> int:
    """The version batch `step` is sampled with in the deterministic mode: max(0, step - k)."""
    return max(0, step - k)


@dataclass
class _Episode:
    length: int
    version: int
    work: float  # worker seconds left, alone
    batch: int  # deterministic: its step; asap: -1


@dataclass
class _Worker:
    active: list[int] = field(default_factory=list)  # episodes being decoded (at most `slots`)
    pending: list[int] = field(default_factory=list)  # deterministic: its share of the batch, waiting
    next_batch: int = 0  # deterministic: the next batch whose share it starts


class _Run:
    """The state of one simulation; `simulate` drives it event by event."""

    def __init__(self, p: Pipeline, s: Schedule):
        self.p, self.s = p, s
        self.rng, self.draws = random.Random(s.seed), []
        self.slots = p.slots or p.batch
        self.workers = [_Worker() for _ in range(p.workers)]
        self.episodes: list[_Episode] = []
        self.batches: dict[int, list[int]] = {}  # deterministic: episodes of each step
        self.finished: Counter[int] = Counter()  # deterministic: finished episodes per step
        self.buffer: list[int] = []  # asap: finished, not yet trained, in order of completion
        self.now, self.version, self.generated, self.dropped = 0.0, 0, 0, 0
        self.trainer: list[float] | None = None  # [trainer seconds left, alone] of the update running
        self.ends: list[float] = []
        self.staleness: list[tuple[int, ...]] = []
        self.lengths: list[tuple[int, ...]] = []

    def length(self, i: int) -> int:
        """The i-th draw of an episode length (the same sequence in every schedule)."""
        while len(self.draws) <= i:
            self.draws.append(self.rng.choice(self.p.lengths))
        return self.draws[i]

    def new_episode(self, draw: int, version: int, batch: int) -> int:
        """A new episode of the `draw`-th length, sampled with `version`; its index."""
        n = self.length(draw)
        self.episodes.append(_Episode(n, version, episode_seconds(self.p, n), batch))
        return len(self.episodes) - 1

    def start_sampling(self) -> None:
        if self.s.mode == "deterministic":
            for w, worker in enumerate(self.workers):
                self.start_share(w, worker)
        else:
            self.start_asap()

    def start_share(self, w: int, worker: _Worker) -> None:
        """Deterministic: the worker's share of its next batch, once its last share is done and the
        batch's version exists."""
        b, s = self.p.batch, self.s
        while (
            not worker.active
            and not worker.pending
            and worker.next_batch < s.steps
            and self.version >= sampling_version(worker.next_batch, s.k)
        ):
            step = worker.next_batch
            worker.next_batch += 1
            ids = self.batches.setdefault(step, [])
            for j in range(w, b, len(self.workers)):  # episode (step, j) is draw step * b + j
                ids.append(self.new_episode(step * b + j, sampling_version(step, s.k), step))
                worker.pending.append(ids[-1])
            self.fill(worker)

    def fill(self, worker: _Worker) -> None:
        while worker.pending and len(worker.active) < self.slots:
            worker.active.append(worker.pending.pop(0))

    def start_asap(self) -> None:
        """Asap: new episodes with the newest version while started - dropped < (version + k + 1) x batch."""
        cap = (self.version + self.s.k + 1) * self.p.batch
        while len(self.episodes) - self.dropped < cap:
            free = [w for w in self.workers if len(w.active) < self.slots]
            if not free:
                return
            worker = min(free, key=lambda w: len(w.active))  # (the first of the least loaded)
            worker.active.append(self.new_episode(len(self.episodes), self.version, -1))

    def start_update(self) -> None:
        t = len(self.ends)
        if self.trainer is not None or t >= self.s.steps:
            return
        if self.s.mode == "deterministic":
            if self.finished[t] < self.p.batch:
                return
            ids = self.batches[t]
        else:
            if self.s.stale == "drop":
                fresh = [i for i in self.buffer if t - self.episodes[i].version <= self.s.k]
                self.dropped += len(self.buffer) - len(fresh)
                self.buffer = fresh
            if len(self.buffer) < self.p.batch:
                return
            ids, self.buffer = self.buffer[: self.p.batch], self.buffer[self.p.batch :]
        batch = [self.episodes[i] for i in ids]
        self.staleness.append(tuple(t - e.version for e in batch))
        self.lengths.append(tuple(e.length for e in batch))
        self.trainer = [update_seconds(self.p, sum(e.length for e in batch))]

    def advance(self) -> None:
        """Run to the next completion: every busy process at its rate (1, or 1/contention while the
        trainer and a sampler are both busy; an episode gets its worker's rate / its active count)."""
        sampling = any(w.active for w in self.workers)
        slow = self.p.contention if sampling and self.trainer is not None else 1.0
        jobs: list[tuple[float, Any]] = []  # (seconds to finish at the current rates, job)
        if self.trainer is not None:
            jobs.append((self.trainer[0] * slow, None))
        for worker in self.workers:
            for i in worker.active:
                jobs.append((self.episodes[i].work * slow * len(worker.active), (worker, i)))
        if not jobs:
            raise RuntimeError(f"the simulated pipeline is stuck at {self.now:.3f} s (a bug)")
        dt = min(d for d, _ in jobs)
        self.now += dt
        ended: list[tuple[_Worker, int]] = []
        for d, job in jobs:
            done = d <= dt * (1 + 1e-12)  # (ties within rounding end together)
            if job is None:
                self.trainer[0] = 0.0 if done else self.trainer[0] - dt / slow
                if done:
                    self.end_update()
                continue
            worker, i = job
            e = self.episodes[i]
            e.work = 0.0 if done else e.work - dt / slow / len(worker.active)
            if done:
                ended.append(job)
        for worker, i in ended:
            self.end_episode(worker, i)

    def end_episode(self, worker: _Worker, i: int) -> None:
        worker.active.remove(i)
        self.generated += 1
        self.fill(worker)
        if self.s.mode == "deterministic":
            self.finished[self.episodes[i].batch] += 1
        else:
            self.buffer.append(i)

    def end_update(self) -> None:
        self.trainer = None
        self.ends.append(self.now)
        self.version += 1


def simulate(p: Pipeline, s: Schedule) -> Prediction:
    """Simulate `s.steps` updates of pipeline `p` under schedule `s` (module docstring), event by
    event: start what can start, run to the next completion, repeat."""
    run = _Run(p, s)
    while len(run.ends) < s.steps:
        run.start_update()  # (first: the stale episodes it drops free the sampler's cap)
        run.start_sampling()
        if len(run.ends) < s.steps:
            run.advance()
    return Prediction(
        s, tuple(run.ends), tuple(run.staleness), tuple(run.lengths), run.generated, run.dropped
    )


def schedules(ks: list[int], steps: int, seed: int = 0) -> list[Schedule]:
    """The table's rows: sync, then for each k > 0 the deterministic mode and asap with stale
    episodes kept and dropped."""
    out = [Schedule(0, steps=steps, seed=seed)]
    for k in sorted(set(ks) - {0}):
        out += [Schedule(k, "deterministic", steps=steps, seed=seed)]
        out += [Schedule(k, "asap", stale, steps, seed) for stale in ("keep", "drop")]
    return out


def table(predictions: list[Prediction]) -> str:
    """A text table, each row against the first (sync): seconds per step past warm-up, the ratio
    of throughputs, samples/s, staleness of the trained samples, their mean length and its ratio
    to sync's, and the share of finished episodes dropped."""
    base = predictions[0]
    head = (
        "schedule",
        "s/step",
        "x sync",
        "samples/s",
        "stale mean",
        "stale max",
        "len mean",
        "x sync",
        "dropped",
    )
    rows = [head]
    for r in predictions:
        rows.append((
            r.schedule.label,
            f"{r.steady_seconds_per_step:.3f}",
            f"{base.steady_seconds_per_step / r.steady_seconds_per_step:.2f}" if r.steady_seconds_per_step else "-",
            f"{r.samples_per_s:.2f}",
            f"{r.mean_staleness:.2f}",
            str(r.max_staleness),
            f"{r.mean_length:.1f}",
            f"{r.mean_length / base.mean_length:.3f}" if base.mean_length else "-",
            f"{r.dropped / max(r.generated, 1):.0%}",
        ))  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    )


def describe(p: Pipeline) -> str:
    """The inputs, one line each."""
    lengths = sorted(p.lengths)
    return "\n".join([
        f"batch: {p.prompts} prompts x {p.group_size} = {p.batch} episodes; {p.workers} sampler worker(s), "
        f"{p.slots or p.batch} episode(s) at once each; contention x{p.contention:g}",
        f"lengths: {len(lengths)} measured, mean {statistics.fmean(lengths):.1f}, median "
        f"{statistics.median(lengths):g}, max {lengths[-1]} tokens",
        f"episode: {p.gen_per_token:.3g} s/token + {p.gen_per_episode:.3g} s + env {p.env_per_episode:.3g} s "
        f"+ grading {p.grade_per_episode:.3g} s",
        f"update: {p.train_per_token:.3g} s/token + {p.train_per_batch:.3g} s + sync {p.sync:.3g} s",
    ])  # fmt: skip
