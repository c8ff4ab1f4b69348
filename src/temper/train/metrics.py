"""Metrics as JSON lines: one object per logged step, appended and flushed as training goes.

`metrics.jsonl` is the record the report and resume read. A config may also name experiment
trackers (`trackers: [tensorboard]`); each row then also goes to them through Accelerate's
tracker interface (`accelerate.tracking.GeneralTracker`, built as `Accelerator.init_trackers`
builds them), from the main process only. Nothing is imported for a tracker unless one is named.
"""

from __future__ import annotations

import atexit
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from temper.atomic import atomic_write_text
from temper.jsonl import iter_jsonl

Tracker = Literal[
    "tensorboard", "trackio", "wandb", "mlflow", "aim", "comet_ml", "clearml", "dvclive", "swanlab"
]
"""Accelerate's tracker names (`accelerate.tracking.LOGGER_TYPE_TO_CLASS`); install the one you
name (`pip install 'temper[track]'` for tensorboard, `'temper[trackio]'` for trackio)."""


class MetricsLog:
    """Appends rows to `path` and, when `trackers` are named, logs them there too.

    trackers: tracker names (see `Tracker`) or `GeneralTracker` instances. Trackers that keep
        files locally (TensorBoard) write under `path.parent / <name>`; hosted ones (trackio,
        wandb) get the run folder's name as project and the stage folder's name as run name.
    config: the stage's settings, stored once as the trackers' hyperparameters.
    """

    def __init__(
        self,
        path: str | Path,
        enabled: bool = True,
        *,
        trackers: Sequence[str | Any] = (),
        config: dict[str, Any] | None = None,
    ):
        self.path, self.enabled = Path(path), enabled
        self.trackers = _open_trackers(trackers, self.path.parent, config) if enabled and trackers else []
        if self.trackers:
            atexit.register(self.close)  # a trainer that raises still closes its writers

    def truncate_after(self, step: int) -> None:
        """Drop rows past `step` (after a resume from that step), atomically. Trackers keep
        theirs: the replayed steps are logged to them again and show as repeated points."""
        if not self.enabled or not self.path.exists():
            return
        # a torn last line (the run was killed mid-write) is one of the rows past `step`: dropped too
        rows = [r for _, _, r in iter_jsonl(self.path) if isinstance(r, dict) and r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def rows(self) -> list[dict[str, Any]]:
        """The rows logged so far (after a resume: those up to its step); none when not enabled."""
        if not self.enabled or not self.path.exists():
            return []
        return [r for _, _, r in iter_jsonl(self.path) if isinstance(r, dict)]

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.trackers:
            values = {k: v for k, v in row.items() if k != "step" and isinstance(v, int | float | str)}
            for tracker in self.trackers:
                tracker.log(values, step=row.get("step"))

    def close(self) -> None:
        """Finish the trackers' runs (flush and close their writers); safe to call twice."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish()


def _open_trackers(names: Sequence[str | Any], out_dir: Path, config: dict[str, Any] | None) -> list:
    """Trackers as `Accelerator.init_trackers` builds them (construct, start, store the config),
    with an install hint instead of Accelerate's silent skip when one is not installed."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    opened = []
    for name in names:
        if isinstance(name, GeneralTracker):
            tracker = name
        elif name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(f"unknown tracker {name!r}; valid: {', '.join(LOGGER_TYPE_TO_CLASS)}")
        else:
            cls = LOGGER_TYPE_TO_CLASS[name]
            builtin = getattr(cls, "__module__", "").startswith("accelerate.")
            if builtin and name not in available:
                raise ValueError(f"tracker {name!r} is not installed: pip install {name}")
            if cls.requires_logging_directory:
                tracker = cls(name, out_dir)  # files under <stage folder>/<tracker name>
            elif name in ("trackio", "wandb"):
                tracker = cls(out_dir.parent.name or "temper", name=out_dir.name)
            else:
                tracker = cls(out_dir.name or "temper")
        tracker.start()
        if config:
            tracker.store_init_configuration(flat_config(config))
        opened.append(tracker)
    return opened


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested settings as the flat scalar dict trackers accept as hyperparameters:
    {"a": {"b": 1}, "c": [1, 2]} -> {"a/b": 1, "c": "[1, 2]"}."""
    out: dict[str, bool | int | float | str] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out |= flat_config(v, f"{prefix}{k}/")
        elif isinstance(v, bool | int | float | str):
            out[f"{prefix}{k}"] = v
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


def progress_bar(enabled: bool) -> Progress:
    """The trainers' progress bar: stage name, bar, steps, a free `info` field, time left."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        disable=not enabled,
    )
