"""Adding a stage kind is one module: a toy kind defined in this file, registered (its kind with
the stages, its section with the report), and taken through parse -> plan -> run -> report -> CLI
without touching any other file."""

import html
import json
import shutil
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from temper.atomic import atomic_write_json
from temper.cli import build_parser, main
from temper.recipe import RecipeError, parse_recipe
from temper.report import find_stages, sections, write_report
from temper.runner import plan, run_recipe
from temper.stages import registry
from temper.stages.base import StageKind, StageRun, Strict


class EchoStage(Strict):
    kind: Literal["echo"]
    name: str = "echo"
    word: str = "hello"
    """What the stage writes into its output."""
    repeat: int = Field(2, gt=0)
    source: str | None = None


def run_echo(stage: EchoStage, job: StageRun) -> Path:
    """'Trains' by copying its source model and records what it said and what it started from."""
    shutil.copytree(job.source, job.out / "model", dirs_exist_ok=True)
    said = {"text": stage.word * stage.repeat, "source": str(job.source)}
    atomic_write_json(job.out / "echo.json", said)
    return job.out / "model"


def echo_section(stage, plots: Path) -> str:
    said = json.loads((stage.folder / "echo.json").read_text())
    return f"<p>echo said {html.escape(said['text'])}</p>"


ECHO = StageKind(
    name="echo",
    spec=EchoStage,
    run=run_echo,
    describe=lambda stage, recipe: f"echo {stage.word!r} x{stage.repeat}",
    reads="model",
    produces_model=True,
    help="a toy stage that copies its model",
    outputs=("echo.json",),
    summary=lambda out: "echo summary: " + json.loads((out / "echo.json").read_text())["text"],
)


@pytest.fixture
def echo():
    registry.register(ECHO)
    sections.register("echo", echo_section)
    yield ECHO
    registry.unregister("echo")
    sections.unregister("echo")


def _recipe(model: Path) -> str:
    return f"""\
name: toy
model: {{path: {model}}}
stages:
  - kind: echo
    word: "<b>"
    repeat: 3
  - kind: echo
    name: again
    source: echo
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "base"
    d.mkdir()
    (d / "weights.txt").write_text("not really a model")
    return d


def test_a_registered_kind_runs_through_parse_plan_run_and_report(echo, model, tmp_path, capsys):
    recipe = parse_recipe(_recipe(model))
    assert [type(s) for s in recipe.stages] == [EchoStage, EchoStage]

    run = tmp_path / "run"
    lines = plan(recipe, run)
    assert lines[0].startswith("1. echo: echo '<b>' x3 ->") and lines[0].endswith("[to run]")

    run_recipe(recipe, tmp_path, run)
    first, second = (json.loads((run / d / "echo.json").read_text()) for d in ("01-echo", "02-again"))
    assert first == {"text": "<b><b><b>", "source": str(model)}  # no model stage before: the recipe's
    assert second["source"] == str(run / "01-echo" / "model")  # `source: echo`
    assert "echo summary: <b><b><b>" in capsys.readouterr().out
    page = (run / "report.html").read_text()
    assert "echo said &lt;b&gt;&lt;b&gt;&lt;b&gt;" in page and "<td>echo</td>" in page

    # complete stages are skipped; an unfinished one is recognised by its outputs
    mtime = (run / "02-again" / "echo.json").stat().st_mtime
    run_recipe(recipe, tmp_path, run)
    assert (run / "02-again" / "echo.json").stat().st_mtime == mtime
    (run / "02-again" / "stage.json").unlink()
    assert [s.kind for s in find_stages(run)] == ["echo", "echo"]
    assert "echo said" in write_report(run).read_text()


def test_a_registered_kind_gets_recipe_errors_and_a_cli_command(echo, model, tmp_path, capsys):
    with pytest.raises(
        RecipeError, match=r"<recipe>:5: stages\[0\].wrd: unknown key 'wrd'; did you mean 'word'\?"
    ):
        parse_recipe(_recipe(model).replace("    word:", "    wrd:"))
    with pytest.raises(RecipeError, match="refers to 'nope', which is not an earlier model stage"):
        parse_recipe(_recipe(model).replace("source: echo", "source: nope"))

    command = build_parser()._subparsers._group_actions[0].choices["echo"]
    help_text = " ".join(command.format_help().split())  # unwrapped
    assert (
        "--word VALUE" in help_text and "What the stage writes into its output. (default: hello)" in help_text
    )
    assert "--source" not in help_text  # chosen by --model
    out = tmp_path / "cli"
    assert main(["echo", "--model", str(model), "--out", str(out), "--word", "hi", "--repeat", "2"]) == 0
    assert "echo summary: hihi" in capsys.readouterr().out
    assert (out / "model" / "weights.txt").exists()


def test_an_unregistered_kind_is_an_unknown_kind(model):
    with pytest.raises(RecipeError, match=r"stages\[0\].kind: unknown stage kind 'echo'"):
        parse_recipe(_recipe(model))


def test_every_kind_keeps_the_contract():
    """The built-in kinds in pipeline order, each spec tagged by its name and carrying the field its
    `reads` promises (the runner and the recipe check read `source` / `models`)."""
    kinds = registry.kinds()
    assert list(kinds) == [
        "pretrain",
        "sft",
        "process_reward_model",
        "constitutional",
        "reward_model",
        "dpo",
        "kto",
        "rl",
        "rft",
        "prompt_distill",
        "select",
        "harness_search",
        "eval",
    ]
    for name, kind in kinds.items():
        fields = kind.spec.model_fields
        assert fields["kind"].annotation == Literal[name] and "name" in fields
        assert {"model": "source", "models": "models"}.get(kind.reads, "kind") in fields
        assert name in sections.SECTIONS and kind.outputs
