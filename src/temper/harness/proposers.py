"""Proposers: what suggests the next harnesses to try, given every candidate scored so far.

A proposer is any object with `propose(base, tried) -> list[str]`: the sources of the next
harness files to evaluate (empty: the search is over), from the starting harness `base` and the
candidates `tried` so far, each with its source, settings, train score and folder (where its
full traces are, for a proposer that reads them). Two are built in:

- `KnobSearch` (`proposer: {kind: knobs}`, the default and what the tests use): coordinate ascent
  over the harness's declared knobs. Each round proposes every one-knob change of the best
  settings so far that has not been tried; the search stops when a round finds nothing better
  (a local optimum: no single knob improves on it) or the budget is spent. Deterministic, and
  with k knobs of v values a round is at most k (v - 1) candidates, not the v^k of a grid.
- `EndpointProposer` (`proposer: {kind: openai, url, model, api_key_env}`): a strong model behind
  an OpenAI-compatible chat endpoint (`temper.rewards.judge.EndpointJudge`: standard library,
  timeouts, retries) reads the best harness's code, every candidate's score and the failed
  episodes of the best one, and writes a whole new harness file; `per_round` of them a round.
  A reply without a python block is skipped (counted), not a failure of the search.

A user's own (`proposer: {kind: python, function: file.py:make, options: {...}}`) is any object
`make(**options)` returns with this `propose`; the stage calls it as user code
(`temper.stages.harness_search`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from temper.harness.file import Harness, with_settings


@dataclass
class Tried:
    """One candidate as a proposer sees it."""

    name: str
    source: str
    settings: dict[str, Any] | None  # None: the file did not load
    score: float | None  # train accuracy; None when the harness was refused
    folder: Path


class Proposer(Protocol):
    def propose(self, base: Harness, tried: list[Tried]) -> list[str]: ...


def _best(tried: list[Tried]) -> Tried:
    """The best scored candidate; ties go to the earlier one (the default first)."""
    scored = [t for t in tried if t.score is not None]
    return max(scored, key=lambda t: t.score)  # max keeps the first of equal keys


@dataclass
class KnobSearch:
    """Coordinate ascent over the declared knobs (module docstring)."""

    max_candidates: int = 20
    rounds: int = 4
    _round: int = 0
    _last_best: str | None = None

    def propose(self, base: Harness, tried: list[Tried]) -> list[str]:
        best = _best(tried)
        if self._round >= self.rounds or (self._round and best.name == self._last_best):
            return []  # the budget of rounds is spent, or the last round improved on nothing
        self._round += 1
        self._last_best = best.name
        seen = [t.settings for t in tried]
        out: list[str] = []
        budget = self.max_candidates - (len(tried) - 1)  # the default is not counted
        for knob, values in base.knobs.items():
            for value in values:
                settings = {**best.settings, knob: value}
                if settings not in seen and len(out) < budget:
                    seen.append(settings)
                    out.append(with_settings(base.source, settings))
        return out


PROMPT = """You improve the harness of a small frozen language model playing an environment task.
A harness is a Python file that decides what the model reads: its interface is in the docstring
of the current best harness below (KNOBS, SETTINGS, bootstrap, build_prompt, update_memory,
system). The model is frozen: only the harness may change, and the environment grades the moves.

Scores so far (greedy accuracy on the training problems):
{scores}

The current best harness ({best}):
```python
{source}
```

Episodes it failed (what the model read and wrote):
{failures}

Write one complete new harness file that you expect to score higher. Reply with the file in a
single ```python block."""


def extract_python(text: str) -> str | None:
    """The first ```python block of a reply (or a bare ``` block), None when there is none."""
    found = re.search(r"```(?:python|py)?\s*\n(.*?)```", text, re.S)
    return found.group(1) if found else None


def failed_episodes(folder: Path, n: int = 3, chars: int = 1500) -> str:
    """The first `n` failed episodes of a candidate's traces, as text, each cut to `chars`."""
    path = folder / "traces.jsonl"
    if not path.is_file():
        return "(no traces)"
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if not row["correct"]:
            text = "".join(f"[{s['by']}] {s['text']}\n" for s in row["episode"])
            out.append(f"problem {row['problem']} ({row['stop_reason']}):\n{text[:chars]}")
        if len(out) == n:
            break
    return "\n".join(out) or "(none failed)"


@dataclass
class EndpointProposer:
    """A model behind an OpenAI-compatible endpoint writes new harness files (module docstring)."""

    complete: Callable[[list[list[dict[str, str]]]], list[str]]
    rounds: int = 2
    per_round: int = 2
    _round: int = 0
    skipped: list[str] = field(default_factory=list)

    def propose(self, base: Harness, tried: list[Tried]) -> list[str]:
        if self._round >= self.rounds:
            return []
        self._round += 1
        best = _best(tried)
        scores = "\n".join(
            f"- {t.name}: {'refused' if t.score is None else f'{t.score:.3f}'}"
            + (f" settings {t.settings}" if t.settings else "")
            for t in tried
        )
        prompt = PROMPT.format(
            scores=scores, best=best.name, source=best.source, failures=failed_episodes(best.folder)
        )
        replies = self.complete([[{"role": "user", "content": prompt}]] * self.per_round)
        out = []
        for reply in replies:
            code = extract_python(reply)
            if code is None:
                self.skipped.append(reply[:200])
            else:
                out.append(code)
        return out
