"""A discrete-event simulator of the RL loop's schedule: sync (k = 0) against asynchronous sampling
with bounded staleness k, predicted before any compute is spent (`temper simulate`).

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

Timing model (what the fit from a run measures, `pipeline_from_run`):
- an episode of L tokens is gen_per_token * L + gen_per_episode + env_per_episode +
  grade_per_episode seconds of its worker; a worker decodes up to `slots` episodes at once and
  shares its speed equally among them (processor sharing: batched decoding of a compute-bound
  sampler, where a batch of n costs n times one episode), so n episodes started together end in
  the order of their lengths and the last at the sum of their times;
- an update over N tokens is train_per_token * N + train_per_batch seconds, then `sync` seconds
  before the sampler has the new version (the trainer is busy meanwhile);
- `contention` >= 1: while the trainer and a sampler worker are both busy each runs that many times
  slower (two processes on a shared CPU); workers are assumed not to slow each other.
Episode lengths are drawn with `random.Random(seed)` from the measured lengths, the i-th episode
started getting the i-th draw in every schedule, so schedules are compared on the same episodes
and a prediction is a pure function of its inputs."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from temper.data.errors import DataError
from temper.jsonl import iter_jsonl

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
        _require("slots", self.slots, lambda v: v is None or (isinstance(v, int) and v >= 1), "an integer >= 1")
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
        run.start_sampling()
        run.start_update()
        if len(run.ends) < s.steps:
            run.advance()
    return Prediction(s, tuple(run.ends), tuple(run.staleness), tuple(run.lengths), run.generated, run.dropped)


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
    head = ("schedule", "s/step", "x sync", "samples/s", "stale mean", "stale max", "len mean", "x sync", "dropped")
    rows = [head]
    for r in predictions:
        rows.append((
            r.schedule.label,
            f"{r.steady_seconds_per_step:.3f}",
            f"{base.steady_seconds_per_step / r.steady_seconds_per_step:.2f}",
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


# ---- inputs: a file of measured values, or a finished run's logs ------------------------------------------


def fit_linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) >= 0 of y ~ a x + b: least squares, a = cov(x, y) / var(x), b = mean(y) - a mean(x);
    through the origin (a = sum xy / sum x^2, b = 0) when the xs do not vary or b would be negative;
    a constant (a = 0, b = mean y) when the slope would be negative or every x is 0."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var > 0:
        a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
        if a >= 0 and my - a * mx >= 0:
            return a, my - a * mx
        if a < 0:
            return 0.0, my
    sxx = sum(x * x for x in xs)
    return (sum(x * y for x, y in zip(xs, ys)) / sxx, 0.0) if sxx > 0 else (0.0, my)


def pipeline_from_file(path: str | Path, **overrides: Any) -> Pipeline:
    """A `Pipeline` from a JSON (or YAML) object of its fields, e.g. {"prompts": 8, "group_size":
    4, "lengths": [12, 40, 200], "gen_per_token": 0.01, "train_per_batch": 2.0}; `overrides` win."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml  # (a core dependency; imported here so the simulator's import stays stdlib-only)

        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(str(path), err.lineno, "<json>", err.msg) from None
    if not isinstance(data, dict):
        raise DataError(str(path), 1, "<top>", "expected an object of Pipeline fields")
    known = [f.name for f in fields(Pipeline)]
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            raise DataError(str(path), 1, key, "unknown field" + (f"; did you mean {near[0]!r}?" if near else ""))
    data = data | {k: v for k, v in overrides.items() if v is not None}
    if isinstance(data.get("lengths"), list):
        data["lengths"] = tuple(data["lengths"])
    return _build(str(path), data)


def _build(source: str, data: dict[str, Any]) -> Pipeline:
    try:
        return Pipeline(**data)
    except TypeError as err:  # a required field missing
        raise DataError(source, 1, "<top>", str(err).split(") ", 1)[-1]) from None
    except ValueError as err:
        raise DataError(source, 1, str(err).split(" ", 1)[0], str(err)) from None


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line, _, row in iter_jsonl(path):
        if isinstance(row, Exception):
            raise DataError(str(path), line, "<json>", str(row))
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_folder(path: str | Path) -> Path:
    """The folder holding an RL stage's metrics.jsonl: `path` itself, or its last stage folder
    (`runs/<name>/NN-<stage>/`) whose metrics.jsonl has `time/sample` rows."""
    path = Path(path)
    if (path / "metrics.jsonl").is_file():
        return path
    found = [
        d
        for d in sorted(path.iterdir())
        if (d / "metrics.jsonl").is_file() and '"time/sample"' in (d / "metrics.jsonl").read_text()
    ]
    if not found:
        raise FileNotFoundError(f"{path}: no metrics.jsonl of an RL stage here or in its stage folders")
    return found[-1]


def pipeline_from_run(path: str | Path, **overrides: Any) -> Pipeline:
    """Fit a `Pipeline` to a finished lockstep run (its metrics.jsonl, one row per step, and
    rollouts.jsonl, the logged episodes). Per step s: episodes n_s = rollout_tokens_per_s x
    time/sample / response_length, tokens N_s = response_length x n_s;
    - sampling: time/sample - n_s x episode/env_seconds ~ gen_per_token N_s + gen_per_episode n_s
      (`fit_linear`; grading is inside time/sample, so it is counted in gen_per_episode);
    - training: time/prepare + time/train (the lockstep sync included) ~ train_per_token N_s +
      train_per_batch;
    - lengths: rollouts.jsonl holds the completions' text, not their token counts: `step_lengths`
      estimates them from the stop reason and the characters, keeping the step's mean
      response_length; the steps' mean lengths without rollouts.jsonl;
    - group_size: the most common number of logged episodes per (step, problem).
    `overrides` (fields of `Pipeline`, None ignored) win over what is fitted."""
    folder = run_folder(path)
    metrics = folder / "metrics.jsonl"
    steps = [r for r in _rows(metrics) if "time/sample" in r and r.get("response_length")]
    if not steps:
        raise DataError(str(metrics), 1, "time/sample", "no step row with time/sample and response_length > 0")
    n = {r["step"]: r["rollout_tokens_per_s"] * r["time/sample"] / r["response_length"] for r in steps}
    tokens = {r["step"]: r["response_length"] * n[r["step"]] for r in steps}
    env = [r.get("episode/env_seconds", 0.0) for r in steps]
    a, b = fit_linear(
        [tokens[r["step"]] for r in steps],
        [max(r["time/sample"] - e * n[r["step"]], 0.0) for r, e in zip(steps, env)],
    )
    episodes = round(statistics.median(n.values()))
    trained = [r for r in steps if "time/train" in r]
    ta, tb = (
        fit_linear([tokens[r["step"]] for r in trained], [r["time/train"] + r.get("time/prepare", 0.0) for r in trained])
        if trained
        else (0.0, 0.0)
    )
    lengths, group = _logged_lengths(folder / "rollouts.jsonl", {r["step"]: r["response_length"] for r in steps})
    group = overrides.get("group_size") or group or 1
    fitted = {
        "prompts": max(1, round(episodes / group)),
        "group_size": group,
        "lengths": lengths or tuple(round(r["response_length"]) for r in steps),
        "gen_per_token": a,
        "gen_per_episode": b / episodes,
        "env_per_episode": statistics.fmean(env),
        "train_per_token": ta,
        "train_per_batch": tb,
    }
    return _build(str(metrics), fitted | {k: v for k, v in overrides.items() if v is not None})


def _logged_lengths(path: Path, mean_tokens: dict[int, float]) -> tuple[tuple[int, ...], int | None]:
    """(estimated token lengths of the logged completions, their most common group size)."""
    if not path.is_file():
        return (), None
    rows = [r for r in _rows(path) if r.get("step") in mean_tokens and isinstance(r.get("completion"), str)]
    if not rows:
        return (), None
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    lengths: list[int] = []
    for step, logged in by_step.items():
        lengths += step_lengths(logged, mean_tokens[step])
    groups = Counter((r["step"], r.get("problem")) for r in rows)
    return tuple(lengths), Counter(groups.values()).most_common(1)[0][0]


def step_lengths(rows: list[dict[str, Any]], mean_tokens: float) -> list[int]:
    """Token lengths of one step's logged completions, whose mean is the step's `mean_tokens`: a
    single-turn completion stopped by the length limit (`stop: length`) has the sampler's
    `max_new_tokens`; the others share the rest, mean_tokens x rows - the limit x stopped, in
    proportion to their characters (capped at the limit when single-turn)."""

    def limit(r: dict[str, Any]) -> int | None:
        sampler = r.get("sampler")
        cap = sampler.get("max_new_tokens") if isinstance(sampler, dict) else None
        return cap if isinstance(cap, int) and "episode" not in r else None  # (multi-turn: per turn)

    cut = [r.get("stop") == "length" and limit(r) is not None for r in rows]
    rest = mean_tokens * len(rows) - sum(limit(r) for r, c in zip(rows, cut) if c)
    chars = sum(len(r["completion"]) for r, c in zip(rows, cut) if not c)
    out = []
    for r, c in zip(rows, cut):
        if c:
            out.append(limit(r))
            continue
        n = rest * len(r["completion"]) / chars if chars else rest / (len(rows) - sum(cut))
        cap = limit(r)
        out.append(round(max(0.0, min(n, cap) if cap is not None else n)))
    return out


# ---- `temper simulate` -------------------------------------------------------------------------------------

HELP = "predict async RL's throughput, staleness and length bias (k = 0, 1, 2, ...) from a finished run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a finished run's folder (or its RL stage folder), or a JSON/YAML file of Pipeline fields")
    p.add_argument("--k", type=int, nargs="+", default=[0, 1, 2], help="max staleness values to compare (default: 0 1 2)")
    p.add_argument("--steps", type=int, default=50, help="updates simulated per schedule (default: 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode-length draws")
    p.add_argument("--workers", type=int, help="sampler workers (default: 1)")
    p.add_argument("--slots", type=int, help="episodes a worker decodes at once (default: a whole batch)")
    p.add_argument("--contention", type=float, help="slowdown of sampler and trainer while both run (default: 1)")
    p.add_argument("--sync", type=float, help="seconds to send weights to the sampler per update (default: 0)")
    p.add_argument("--prompts", type=int, help="prompts per step (default: the run's)")
    p.add_argument("--group-size", type=int, help="episodes per prompt (default: the run's)")


def cmd_simulate(args: argparse.Namespace) -> None:
    """Fit the inputs, simulate sync and each k, print the inputs and the table."""
    overrides = {
        "workers": args.workers, "slots": args.slots, "contention": args.contention, "sync": args.sync,
        "prompts": args.prompts, "group_size": args.group_size,
    }  # fmt: skip
    source = Path(args.source)
    if source.is_dir():
        p = pipeline_from_run(source, **overrides)
    elif source.is_file():
        p = pipeline_from_file(source, **overrides)
    else:
        raise FileNotFoundError(f"{source}: no such run folder or file")
    try:
        rows = schedules(args.k, args.steps, args.seed)
    except ValueError as err:
        raise DataError("command line", 1, str(err).split(" ", 1)[0], str(err)) from None
    print(describe(p))
    print(table([simulate(p, s) for s in rows]))
