"""Metrics as JSON lines: one object per logged step, appended and flushed as training goes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from temper.atomic import atomic_write_text
from temper.jsonl import iter_jsonl


class MetricsLog:
    def __init__(self, path: str | Path, enabled: bool = True):
        self.path, self.enabled = Path(path), enabled

    def truncate_after(self, step: int) -> None:
        """Drop rows past `step` (after a resume from that step), atomically."""
        if not self.enabled or not self.path.exists():
            return
        # a torn last line (the run was killed mid-write) is one of the rows past `step`: dropped too
        rows = [r for _, _, r in iter_jsonl(self.path) if isinstance(r, dict) and r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


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
