"""What the experiment summaries share (rlvp.py, milestones.py, curriculum.py, multiseed.py): a
multiseed run's stage folders and their metrics, cells over seeds and paired differences, markdown
tables and the command line. Imported as a sibling module (the scripts run from any folder).

Cells: `spread` is mean ± sample std [min, max] over seeds; `paired` is the mean of the per-seed
differences b - a, the differences themselves and a two-sided 95% t-interval over seeds,
mean ± t(0.975, n-1) · s / sqrt(n) (Student; n = seeds, s = the sample std of the differences).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temper.atomic import atomic_write_text

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # two-sided 95% t quantiles by dof


def stage(run: Path, name: str) -> Path:
    """The folder `NN-<name>` of a stage in the run folder `run`."""
    found = sorted(run.glob(f"[0-9][0-9]-{name}"))
    if not found:
        raise SystemExit(f"{run}: no stage folder named *-{name}")
    return found[0]


def metrics(run: Path, name: str) -> list[dict]:
    """A training stage's metrics.jsonl, one dict per step."""
    path = stage(run, name) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_result(run: Path, task: str, model: str, split: str) -> dict[str, Any]:
    """One (task, model, split) entry of the run's eval stage."""
    return json.loads((stage(run, "eval") / "eval.json").read_text())[task][model][split]


def greedy(run: Path, task: str, model: str, split: str) -> float:
    return eval_result(run, task, model, split)["metrics"]["greedy_accuracy"]["value"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """mean ± sample std [min, max], each times `scale`."""
    m = statistics.mean(values) * scale
    std = (statistics.stdev(values) if len(values) > 1 else 0.0) * scale
    f = f"{{:.{digits}f}}"
    return (
        f"{f.format(m)} ± {f.format(std)} [{f.format(min(values) * scale)}, {f.format(max(values) * scale)}]"
    )


def t_interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the two-sided 95% t-interval) over seeds; half-width 0 for one value."""
    m = statistics.mean(values)
    if len(values) < 2:
        return m, 0.0
    return m, T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5


def paired(a: list[float], b: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """mean of b - a per seed, the per-seed differences, and a 95% t-interval (module docstring)."""
    d = [(y - x) * scale for x, y in zip(a, b, strict=True)]
    m, half = t_interval(d)
    f = f"{{:+.{digits}f}}"
    cells = ", ".join(f.format(x) for x in d)
    if len(d) < 2:
        return f"{f.format(m)} ({cells})"
    shown = round(m, digits) + 0.0  # a mean that rounds to zero shows as +0.0, never -0.0
    return f"{f.format(shown)} ({cells}) [{f.format(m - half)}, {f.format(m + half)}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def cli(doc: str, summarize: Callable[..., str], options: dict[str, tuple[type, Any, str]]) -> None:
    """The command line every summary has: the multiseed run folder, --seeds, --out, and its own
    `options` (name -> (type, default, help)), passed to `summarize(root, seeds, **options)`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("root", type=Path, help="the multiseed run folder (holding seed-<s>/)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    for name, (kind, default, text) in options.items():
        parser.add_argument(f"--{name}", type=kind, default=default, help=text)
    parser.add_argument("--out", help="markdown file for the tables")
    args = parser.parse_args()
    text = summarize(args.root, args.seeds, **{name: getattr(args, name) for name in options})
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
