"""The outer loop of harness optimisation (Meta-Harness, Lee et al. 2026): propose, play, keep.

    summary = search(base, proposer, play_train, play_held_out, out, select_top=3)

1. The starting harness `base` (the default) is candidate 00. Each round the proposer suggests
   harness files (`temper.harness.proposers`); each is written to a folder of its own and
   played by the frozen model on the train problems (`play_train`, greedy).
2. Every candidate's folder holds what a proposer may grep and diff:
       candidates/NN-<label>/harness.py      the code, as played
                             train.json      its scores (accuracy with a Wilson interval, mean
                                             reward, per-problem correctness, failures)
                             traces.jsonl    every episode in full: what the model read and wrote
                             error.txt       instead of the scores, when the file was refused
3. The `select_top` best on train (the default always among them) are played on the held-out
   selection problems, and the best there is kept (ties: the better on train, then the earlier):
   `best/harness.py`. The default and the kept harness are then played on the final held-out
   problems, which neither the search nor the selection saw: the figure `final` reports, so the
   kept harness's advantage is not the selection's own optimism.

A candidate file that cannot be loaded is recorded (error.txt, no score) and the search goes on;
episodes that fail in the harness's code end as env_error (counted in `failures`, first line
kept), graded wrong like any failure.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.atomic import atomic_write_text
from temper.harness.file import Harness, HarnessError, load_harness, with_settings
from temper.harness.proposers import Proposer, Tried
from temper.stats import wilson_interval

Play = Callable[[Harness], tuple[dict[str, Any], list[dict[str, Any]]]]
"""A harness -> (its scores, its traces) on a fixed set of problems."""


def scores_of(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy (Wilson 95% interval), mean reward, per-problem correctness and failures of the
    episodes `traces` (one row per problem, `play_episodes`' rows)."""
    n = len(traces)
    wins = sum(t["correct"] for t in traces)
    lo, hi = wilson_interval(wins, n)
    errors = [t for t in traces if t["stop_reason"] in ("env_error", "timeout")]
    return {
        "accuracy": {"value": wins / n, "lo": lo, "hi": hi},
        "reward": sum(t["reward"] for t in traces) / n,
        "n": n,
        "correct": "".join("1" if t["correct"] else "0" for t in traces),
        "failures": {"count": len(errors), "first": errors[0]["error"] if errors else None},
    }


@dataclass
class Candidate:
    name: str
    folder: Path
    harness: Harness | None
    error: str | None = None
    train: dict[str, Any] | None = None
    held_out: dict[str, Any] | None = None

    def tried(self) -> Tried:
        score = self.train["accuracy"]["value"] if self.train else None
        return Tried(
            self.name, self._source(), self.harness.settings if self.harness else None, score, self.folder
        )

    def _source(self) -> str:
        return self.harness.source if self.harness else (self.folder / "harness.py").read_text()

    def row(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "folder": self.folder.name,
            "settings": self.harness.settings if self.harness else None,
            "error": self.error,
            "train": self.train and _brief(self.train),
            "held_out": self.held_out and _brief(self.held_out),
        }


def _brief(scores: dict[str, Any]) -> dict[str, Any]:
    return {k: scores[k] for k in ("accuracy", "reward", "n", "failures")}


def label(base: Harness, source: str, harness: Harness | None) -> str:
    """A folder label: the knobs that differ from the default (`memory=none`), else `edited`."""
    if harness is None:
        return "refused"
    if source == base.source:
        return "default"
    changed = [f"{k}={v}" for k, v in harness.settings.items() if base.settings.get(k) != v]
    same_code = with_settings(source, {}) == with_settings(base.source, {})  # the code but SETTINGS
    text = ",".join(changed) if changed and same_code else "edited"
    return "".join(c if c.isalnum() or c in "=,+-_." else "_" for c in text)[:60]


def _write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=1) + "\n")


def _write_traces(path: Path, traces: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(t) + "\n" for t in traces))


def _played(candidate: Candidate, play: Play, what: str) -> dict[str, Any]:
    scores, traces = play(candidate.harness)
    _write_json(candidate.folder / f"{what}.json", scores)
    _write_traces(candidate.folder / ("traces.jsonl" if what == "train" else f"{what}_traces.jsonl"), traces)
    return scores


def search(
    base: Harness,
    proposer: Proposer,
    play_train: Play,
    play_select: Play,
    play_final: Play,
    out: Path,
    *,
    select_top: int = 3,
    say: Callable[[str], None] = lambda line: None,
    about: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the loop (module docstring) into `out`; -> the summary written to
    `out/harness_search.json` (with `about`: what the caller adds, e.g. the task and the splits)."""
    root = out / "candidates"
    root.mkdir(parents=True, exist_ok=True)
    candidates: list[Candidate] = []

    def add(source: str) -> None:
        index = len(candidates)
        staging = root / f"{index:02d}"
        staging.mkdir(exist_ok=True)
        (staging / "harness.py").write_text(source)
        harness, error = None, None
        try:
            harness = load_harness(staging / "harness.py")
        except HarnessError as err:
            error = str(err)
        folder = root / f"{index:02d}-{label(base, source, harness)}"
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
        if harness is not None:  # the path it is played from (failure lines name the file's name)
            harness = dataclasses.replace(harness, path=folder / "harness.py")
        c = Candidate(folder.name, folder, harness, error)
        if error is not None:
            (folder / "error.txt").write_text(error + "\n")
            say(f"{folder.name}: refused: {error}")
        else:
            c.train = _played(c, play_train, "train")
            say(f"{folder.name}: train accuracy {c.train['accuracy']['value']:.3f}")
        candidates.append(c)

    add(base.source)
    while sources := proposer.propose(base, [c.tried() for c in candidates]):
        for source in sources:
            add(source)

    scored = [c for c in candidates if c.train is not None]
    ranked = sorted(scored, key=lambda c: -c.train["accuracy"]["value"])  # stable: earlier first on ties
    shortlist = ranked[:select_top]
    if candidates[0] not in shortlist:
        shortlist.append(candidates[0])
    for c in shortlist:
        c.held_out = _played(c, play_select, "held_out")
        say(f"{c.name}: held-out accuracy {c.held_out['accuracy']['value']:.3f}")
    order = {id(c): i for i, c in enumerate(candidates)}
    best = max(
        shortlist,
        key=lambda c: (c.held_out["accuracy"]["value"], c.train["accuracy"]["value"], -order[id(c)]),
    )
    (out / "best").mkdir(exist_ok=True)
    shutil.copyfile(best.folder / "harness.py", out / "best" / "harness.py")
    final = {}
    played: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for role, c in (("default", candidates[0]), ("best", best)):
        if id(c) not in played:  # greedy episodes: the default kept is played once
            played[id(c)] = play_final(c.harness)
        scores, traces = played[id(c)]
        _write_json(out / "best" / f"final_{role}.json", scores)
        _write_traces(out / "best" / f"final_{role}_traces.jsonl", traces)
        final[role] = _brief(scores) | {"correct": scores["correct"]}
    summary = {
        **(about or {}),
        "default": candidates[0].name,
        "best": best.name,
        "best_settings": best.harness.settings,
        "candidates": [c.row() for c in candidates],
        "final": final,
    }
    _write_json(out / "harness_search.json", summary)
    return summary
