"""Which section each stage kind gets on the page, by the kind's name (what stage.json records).

The sections live in this package and the stage kinds in `temper.stages`, which never imports the
report: the report sits above the stages and looks them up. A kind defined elsewhere (a plugin, a
test's toy kind) enters its section with `register`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from temper.report.common import Stage, esc
from temper.report.constitutional import constitutional_section
from temper.report.evaluation import eval_section
from temper.report.harness_search import harness_search_section
from temper.report.prompt_distill import prompt_distill_section
from temper.report.reward_model import reward_model_section
from temper.report.rft import rft_section
from temper.report.rl import rl_section
from temper.report.select import select_section
from temper.report.training import training_section

Section = Callable[[Stage, Path], str]

SECTIONS: dict[str, Section] = {
    "pretrain": training_section,
    "sft": training_section,
    "process_reward_model": training_section,
    "constitutional": constitutional_section,
    "reward_model": reward_model_section,
    "dpo": training_section,
    "kto": training_section,
    "rl": rl_section,
    "rft": rft_section,
    "prompt_distill": prompt_distill_section,
    "select": select_section,
    "harness_search": harness_search_section,
    "eval": eval_section,
    "training": training_section,  # a training stage that stopped before stage.json: its curve so far
}


def register(kind: str, section: Section) -> None:
    """Enter the section of a stage kind registered outside `temper.stages`."""
    if kind in SECTIONS and SECTIONS[kind] is not section:
        raise ValueError(f"stage kind {kind!r} already has a report section")
    SECTIONS[kind] = section


def unregister(kind: str) -> None:
    SECTIONS.pop(kind, None)


def unknown_section(stage: Stage, plots: Path) -> str:
    files = ", ".join(sorted(p.name for p in stage.folder.iterdir() if not p.name.startswith(".")))
    return f"<p>No report section for stage kind '{esc(stage.kind)}'. Files: {esc(files) or 'none'}.</p>"


def section_for(kind: str) -> Section:
    """The kind's section, or a note listing the stage's files for a kind without one."""
    return SECTIONS.get(kind, unknown_section)
