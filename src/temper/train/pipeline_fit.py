"""The inputs of `temper.train.pipeline_sim` measured: fitted to a finished lockstep run's logs
(metrics.jsonl and rollouts.jsonl) or read from a file of `Pipeline` fields; and the `temper
simulate` command, which prints the fitted inputs and a table of sync against each k."""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

from temper.data.errors import DataError
from temper.jsonl import iter_jsonl
from temper.train.pipeline_sim import Pipeline, describe, schedules, simulate, table


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
            raise DataError(
                str(path), 1, key, "unknown field" + (f"; did you mean {near[0]!r}?" if near else "")
            )
    if isinstance(data.get("lengths"), list):
        data["lengths"] = tuple(data["lengths"])
    return _build(str(path), data, overrides)


def _build(source: str, data: dict[str, Any], overrides: dict[str, Any]) -> Pipeline:
    """The `Pipeline` of `data` with the `overrides` not None; a bad value is a `DataError` naming
    the field and where it came from (`source`, or the command line for an override)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Pipeline(**(data | given))
    except TypeError as err:  # a required field missing
        raise DataError(source, 1, "<top>", str(err).split(") ", 1)[-1]) from None
    except ValueError as err:
        name = str(err).split(" ", 1)[0]
        raise DataError("command line" if name in given else source, 1, name, str(err)) from None


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
        raise DataError(
            str(metrics), 1, "time/sample", "no step row with time/sample and response_length > 0"
        )
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
        fit_linear(
            [tokens[r["step"]] for r in trained],
            [r["time/train"] + r.get("time/prepare", 0.0) for r in trained],
        )
        if trained
        else (0.0, 0.0)
    )
    lengths, group = _logged_lengths(
        folder / "rollouts.jsonl", {r["step"]: r["response_length"] for r in steps}
    )
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
    return _build(str(metrics), fitted, overrides)


def _logged_lengths(path: Path, mean_tokens: dict[int, float]) -> tuple[tuple[int, ...], int | None]:
    """(token lengths of the logged completions: their recorded `tokens`, else estimated by
    `step_lengths`; their most common group size)."""
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
        if all(isinstance(r.get("tokens"), int) for r in logged):  # recorded (runs since the field)
            lengths += [r["tokens"] for r in logged]
        else:
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
    p.add_argument(
        "source",
        help="a finished run's folder (or its RL stage folder), or a JSON/YAML file of Pipeline fields",
    )
    p.add_argument(
        "--k", type=int, nargs="+", default=[0, 1, 2], help="max staleness values to compare (default: 0 1 2)"
    )
    p.add_argument("--steps", type=int, default=50, help="updates simulated per schedule (default: 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode-length draws")
    p.add_argument("--workers", type=int, help="sampler workers (default: 1)")
    p.add_argument("--slots", type=int, help="episodes a worker decodes at once (default: a whole batch)")
    p.add_argument(
        "--contention", type=float, help="slowdown of sampler and trainer while both run (default: 1)"
    )
    p.add_argument(
        "--sync", type=float, help="seconds to send weights to the sampler per update (default: 0)"
    )
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
