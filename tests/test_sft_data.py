"""SFT on the user's data sets: `eval_files` for the eval loss, `epochs` instead of `max_steps`,
and every path in a recipe relative to the recipe's folder whatever the working directory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from temper.cli import main
from temper.data import load_rows
from temper.recipe import RecipeError, load_recipe, parse_recipe
from temper.stages.base import StageError, epoch_steps
from temper.train.supervised import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def rows(n: int, start: int = 0) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": f"{i}+1"}, {"role": "assistant", "content": f"{i + 1}"}]}
        for i in range(start, start + n)
    ]


@pytest.fixture
def model(tmp_path, tokenizer, nano) -> Path:
    folder = tmp_path / "models" / "m"
    nano.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_epochs_set_the_steps_from_the_data_and_batch_size(model, tmp_path, capsys):
    data, held = tmp_path / "d.parquet", tmp_path / "held.json"
    pq.write_table(pa.Table.from_pylist(rows(10)), data)
    held.write_text(json.dumps(rows(3, start=50)))
    out = tmp_path / "out"
    args = ["sft", "--model", str(model), "--data.files", str(data), "--train.batch_size", "4"]
    args += ["--train.warmup_steps", "0", "--train.epochs", "2"]
    assert main([*args, "--data.eval_files", str(held), "--out", str(out)]) == 0
    summary = json.loads((out / "sft.json").read_text())
    assert summary["steps"] == math.ceil(2 * 10 / 4) == 5 and summary["epochs"] == 2
    assert summary["eval_loss"] is not None  # no task: the eval loss is the eval file's
    assert "2 epochs of 10 sequences at batch_size 4 = 5 steps" in capsys.readouterr().err
    # without eval_files (and no task) there is nothing held out
    assert main([*args, "--out", str(tmp_path / "out2")]) == 0
    assert json.loads((tmp_path / "out2" / "sft.json").read_text())["eval_loss"] is None


def test_epoch_steps_round_up_and_check_the_warmup():
    assert epoch_steps(TrainConfig(max_steps=7), 100, "sft").max_steps == 7  # no epochs: unchanged
    assert epoch_steps(TrainConfig(epochs=1.5, batch_size=8, warmup_steps=1), 10, "sft").max_steps == 2
    assert epoch_steps(TrainConfig(epochs=0.01, batch_size=8, warmup_steps=0), 10, "sft").max_steps == 1
    with pytest.raises(StageError, match=r"are 2 steps, not more than warmup_steps \(2\)"):
        epoch_steps(TrainConfig(epochs=1.5, batch_size=8, warmup_steps=2), 10, "sft")
    # left unset, the warm-up is a tenth of the counted steps: a short run is not refused
    assert epoch_steps(TrainConfig(epochs=1.5, batch_size=8), 10, "sft").resolved_warmup() == 0
    assert epoch_steps(TrainConfig(epochs=3, batch_size=1), 100, "sft").resolved_warmup() == 20
    assert epoch_steps(TrainConfig(epochs=1, batch_size=1), 150, "sft").resolved_warmup() == 15


RECIPE = """\
name: epochs
model: {preset: nano}
tasks: {arithmetic: {max_digits: 2}}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 4, batch_size: 4, warmup_steps: 1}
  - kind: sft
    data: {tasks: [arithmetic], problems_per_task: 10, files: [d.jsonl]}
    train: {epochs: 2, batch_size: 4, warmup_steps: 1}
"""


def test_epochs_or_max_steps_not_both_and_the_plan_shows_the_steps(tmp_path, capsys):
    with pytest.raises(RecipeError, match=r"r.yaml:10: stages\[1\].train.epochs: give epochs or max_steps"):
        parse_recipe(RECIPE.replace("{epochs: 2,", "{epochs: 2, max_steps: 9,"), "r.yaml")
    flags = ["--train.epochs", "2", "--train.max_steps", "3"]
    assert main(["sft", "--model", str(tmp_path), "--out", str(tmp_path / "o"), *flags]) == 2
    assert "--train.epochs: give epochs or max_steps, not both" in capsys.readouterr().err
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(6)))
    (tmp_path / "r.yaml").write_text(RECIPE)
    assert main(["run", str(tmp_path / "r.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sft on ['arithmetic', 'd.jsonl'], 2 epochs" in out
    assert "sft: 2 epochs of 16 rows at batch_size 4 = at most 8 steps (exact once tokenized)" in out


def _project(tmp_path: Path, model: Path) -> Path:
    """recipes/r.yaml naming ../data and ../models/m; returns the recipe path."""
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(rows(8)), data / "train.parquet")
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows(4)), "test": datasets.Dataset.from_list(rows(2, 20))}
    ).save_to_disk(str(data / "ds"))
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text(
        "name: paths\n"
        "output_dir: ../runs/paths\n"
        "model: {path: ../models/m}\n"
        "stages:\n"
        "  - kind: sft\n"
        "    data: {files: [../data/train.parquet, ../data/ds], eval_files: ['../data/ds[test]']}\n"
        "    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}\n"
        "  - {kind: eval, tasks: [arithmetic], splits: [test], n_problems: 2, k: 1, max_new_tokens: 4}\n"
        "tasks: {arithmetic: {max_digits: 1}}\n"
    )
    return recipe


def test_recipe_paths_resolve_against_the_recipe_folder_from_any_directory(
    tmp_path, model, monkeypatch, capsys
):
    recipe = _project(tmp_path, model)
    elsewhere = tmp_path / "a" / "b"  # where ../models, ../data and ../runs are not the recipe's
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    stage = tmp_path / "runs" / "paths" / "01-sft"  # output_dir too is relative to the recipe
    summary = json.loads((stage / "sft.json").read_text())
    assert summary["data"]["examples"] == 12 and summary["eval_loss"] is not None
    assert not (elsewhere / "runs").exists()
    # the eval's starting model is the recipe's ../models/m, found from the recipe's folder too
    evaluated = json.loads((tmp_path / "runs" / "paths" / "02-eval" / "eval.json").read_text())
    assert list(evaluated["arithmetic"]) == ["../models/m", "sft"]


def test_a_path_found_only_relative_to_the_working_directory_is_refused_naming_both(
    tmp_path, model, monkeypatch, capsys
):
    recipe = _project(tmp_path, model)
    text = recipe.read_text()
    monkeypatch.chdir(tmp_path)  # where `models/m` and `data/...` do exist
    recipe.write_text(text.replace("../models/m", "models/m").replace("../data/train", "data/train"))
    assert main(["run", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert (
        f"r.yaml:3: model.path: 'models/m' is not a folder relative to the recipe (tried {tmp_path / 'recipes' / 'models' / 'm'})"
        in err
    )
    assert f"but {model} exists relative to the current directory" in err
    assert (
        f"r.yaml:6: stages[0].data.files[0]: '{tmp_path / 'recipes' / 'data' / 'train.parquet'}' does not exist"
        in err
    )
    assert f"{tmp_path / 'data' / 'train.parquet'} exists relative to the current directory" in err


def test_a_missing_split_or_eval_file_is_refused_at_plan_time(tmp_path, model, capsys):
    recipe = _project(tmp_path, model)
    text = recipe.read_text()
    recipe.write_text(text.replace("'../data/ds[test]'", "'../data/ds[validation]', ../data/gone.json"))
    assert main(["run", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:6: stages[0].data.eval_files[0]: " in err
    assert "has no split 'validation'; its splits are ['train', 'test']" in err
    assert "r.yaml:6: stages[0].data.eval_files[1]: " in err and "gone.json' does not exist" in err


def test_the_sft_from_parquet_recipe_validates_and_its_data_loads(capsys):
    recipe = ROOT / "recipes" / "sft_from_parquet.yaml"
    parsed = load_recipe(recipe)
    assert main(["run", str(recipe), "--dry-run"]) == 0, capsys.readouterr().err
    sft = next(s for s in parsed.stages if s.kind == "sft")
    for spec in sft.data.files + sft.data.eval_files:
        examples, report = load_rows(spec, recipe.parent)
        assert examples and report.skipped == 0
    assert all(s.endswith(".parquet") for s in sft.data.files + sft.data.eval_files)
    # its pretrain stage is the quickstart's: it reuses the shipped base instead of training
    from temper.stages.context import StageContext
    from temper.stages.pretrain import pretrain_hash

    shipped = json.loads((ROOT / "checkpoints" / "tiny-base" / "pretrain.json").read_text())["hash"]
    ctx = StageContext(run_dir=ROOT, base_dir=recipe.parent, tasks={}, task_options=parsed.tasks)
    assert pretrain_hash(parsed.stages[0], parsed.model, ctx) == shipped


def test_a_bad_source_with_epochs_is_one_plan_error(tmp_path, capsys):
    (tmp_path / "d.json").write_text("[{not json")
    (tmp_path / "r.yaml").write_text(
        RECIPE.replace("d.jsonl", "d.json").replace("files: [d.json]", "files: [d.json, gone.parquet]")
    )
    assert main(["run", str(tmp_path / "r.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:9: stages[1].data.files[1]: " in err and "gone.parquet' does not exist" in err
    assert "Traceback" not in err
