import importlib.util
from pathlib import Path

import pytest

from temper.cli import main
from temper.recipe import RecipeError, load_recipe, parse_recipe

GOOD = """\
name: t
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 2}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 100}
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
  - kind: sft
    data: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
  - kind: eval
    n_problems: 4
"""


def test_valid_recipe_parses_with_defaults():
    recipe = parse_recipe(GOOD)
    assert [s.kind for s in recipe.stages] == ["pretrain", "sft", "eval"]
    assert recipe.stages[1].train.max_steps == 2 and recipe.stages[2].splits == ["test", "ood"]


def test_unknown_key_names_line_path_and_nearest_key():
    bad = GOOD.replace(
        "train: {max_steps: 2, batch_size: 4, warmup_steps: 0}\n  - kind: eval",
        "train: {max_steps: 2, batch_sise: 4, warmup_steps: 0}\n  - kind: eval",
    )
    with pytest.raises(RecipeError) as err:
        parse_recipe(bad, "r.yaml")
    message = str(err.value)
    assert (
        "r.yaml:11: stages[1].train.batch_sise: unknown key 'batch_sise'; did you mean 'batch_size'?"
        in message
    )


def test_unknown_stage_key_and_bad_value():
    bad = GOOD.replace("  - kind: eval\n    n_problems: 4", "  - kind: eval\n    n_problem: 4\n    k: zero")
    with pytest.raises(RecipeError) as err:
        parse_recipe(bad, "r.yaml")
    message = str(err.value)
    assert "r.yaml:13: stages[2].n_problem: unknown key 'n_problem'; did you mean 'n_problems'?" in message
    assert "r.yaml:14: stages[2].k: Input should be a valid integer" in message


def test_a_misspelled_choice_suggests_the_nearest_valid_value():
    bad = GOOD.replace(
        "train: {max_steps: 2, batch_size: 4, warmup_steps: 0}\n  - kind: sft",
        "train: {schedule: cosin}\n  - kind: sft",
    )
    bad = bad.replace("kind: eval\n", "kind: eval\n    splits: [tset, ood]\n")
    with pytest.raises(RecipeError) as err:
        parse_recipe(bad, "r.yaml")
    message = str(err.value)
    assert (
        "r.yaml:8: stages[0].train.schedule: unknown value 'cosin'; did you mean 'cosine'? "
        "Valid: cosine, wsd, constant" in message
    )
    assert "r.yaml:13: stages[2].splits[0]: unknown value 'tset'; did you mean 'test'?" in message
    with pytest.raises(
        RecipeError,
        match=r"r.yaml:12: stages\[2\].kind: unknown stage kind 'evaluate'; did you mean 'eval'\?",
    ):
        parse_recipe(GOOD.replace("kind: eval", "kind: evaluate"), "r.yaml")
    with pytest.raises(RecipeError, match=r"model.preset: unknown value 'tinny'; did you mean 'tiny'\?"):
        parse_recipe(GOOD.replace("preset: nano", "preset: tinny"))


def test_stage_help_shows_every_fields_docstring_and_default(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "--train.lr FLOAT Peak learning rate. (default: 0.001)" in text  # a dataclass field
    assert "--train.schedule {cosine,wsd,constant}" in text and "(default: cosine)" in text
    assert (
        "--data.eval_problems INT Test-split demonstrations per task for the eval loss. (default: 64)" in text
    )
    assert "--data.tasks LIST" in text and "--lora.target_modules" in text


def test_unknown_stage_kind_and_task_references():
    with pytest.raises(RecipeError, match="stages\\[2\\]"):
        parse_recipe(GOOD.replace("kind: eval", "kind: evaluate"))
    with pytest.raises(RecipeError, match="uses task 'general_points', which is not in the recipe's tasks"):
        parse_recipe(GOOD.replace("corpus: {tasks: [arithmetic]", "corpus: {tasks: [general_points]"))
    with pytest.raises(RecipeError, match="unknown option 'max_digit'"):
        parse_recipe(GOOD.replace("{max_digits: 2}", "{max_digit: 2}"))


def test_preset_needs_pretrain_first_and_references_must_exist():
    no_pretrain = GOOD.replace(
        "  - kind: pretrain\n    corpus: {tasks: [arithmetic], problems_per_task: 100}\n    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}\n",
        "",
    )
    with pytest.raises(RecipeError, match="first stage must be 'pretrain'"):
        parse_recipe(no_pretrain)
    with pytest.raises(RecipeError, match="refers to 'sft2'"):
        parse_recipe(GOOD.replace("    n_problems: 4", "    n_problems: 4\n    models: [sft2]"))


def test_yaml_syntax_error_has_a_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\nmodel: {preset: nano\nstages: []\n")
    with pytest.raises(RecipeError, match=r"r.yaml:\d+: invalid YAML"):
        load_recipe(path)


def test_dry_run_prints_the_plan(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(GOOD)
    assert main(["run", str(path), "--dry-run", "--output-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "1. pretrain: pretrain nano" in out and "3. eval" in out and "[to run]" in out
    assert not (tmp_path / "run").exists()


def test_cli_reports_recipe_errors_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(GOOD.replace("name: t", "name: t\nnmae: u"))
    assert main(["run", str(path)]) == 2
    assert "unknown key 'nmae'; did you mean 'name'?" in capsys.readouterr().err


def test_stage_flags_are_validated(tmp_path, capsys):
    code = main(["sft", "--model", str(tmp_path), "--out", str(tmp_path / "o"), "--train.lr", "fast"])
    assert code == 2
    assert "--train.lr: Input should be a valid number" in capsys.readouterr().err
    code = main(["sft", "--model", str(tmp_path), "--out", str(tmp_path / "o"), "--train.schedule", "wsdd"])
    assert code == 2
    assert "--train.schedule: unknown value 'wsdd'; did you mean 'wsd'?" in capsys.readouterr().err


def test_stage_flags_meet_the_cross_field_rules_at_their_flag(tmp_path, capsys):
    """A rule across fields (here: a group-relative estimator needs 2 samples per prompt) names
    the flag, as a range error does, before the model is loaded."""
    out = tmp_path / "o"
    args = [
        "rl",
        "--model",
        str(tmp_path),
        "--out",
        str(out),
        "--tasks",
        "arithmetic",
        "--train.group_size",
        "1",
    ]
    assert main(args) == 2
    assert "--train.group_size: must be at least 2 with advantage 'grpo'" in capsys.readouterr().err
    assert main(args[:-4] + ["--train.steps", "0"]) == 2
    assert "--train.steps: Input should be greater than or equal to 1" in capsys.readouterr().err
    assert not out.exists()


def test_rl_command_stops_at_the_format_gate(tmp_path, capsys):
    base = Path(__file__).parents[1] / "checkpoints" / "tiny-base" / "model"  # never saw `Answer:`
    args = [
        "rl",
        "--model",
        str(base),
        "--out",
        str(tmp_path / "rl"),
        "--tasks",
        "arithmetic",
        "--gate.min_parse_rate",
        "0.5",
        "--gate.n_problems",
        "8",
        "--train.rewards",
        "{outcome: 1, format: 0.1}",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "format gate: parse rate below 50%" in err and "SFT is not done" in err
    assert not (tmp_path / "rl" / "model").exists()


def test_eval_labels_models_by_their_stage_folder(tmp_path):
    from temper.cli import model_label

    for name in ("02-sft", "03-rl"):
        (tmp_path / name / "model").mkdir(parents=True)
    taken: dict = {}
    for path in (tmp_path / "02-sft" / "model", tmp_path / "03-rl" / "model", tmp_path / "03-rl" / "model"):
        taken[model_label(str(path), taken)] = path
    assert list(taken) == ["02-sft", "03-rl", "03-rl#2"]
    assert model_label("Qwen/Qwen3-0.6B", taken) == "Qwen/Qwen3-0.6B"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_sampler_without_vllm_is_a_clear_error(tmp_path, capsys):
    base = Path(__file__).parents[1] / "checkpoints" / "tiny-base" / "model"
    args = [
        "rl",
        "--model",
        str(base),
        "--out",
        str(tmp_path / "rl"),
        "--tasks",
        "arithmetic",
        "--sampler",
        "vllm",
    ]
    assert main(args) == 2
    assert "VLLMSampler needs vLLM" in capsys.readouterr().err


def test_the_shipped_base_matches_the_recipes_that_reuse_it():
    """`make demo` reuses checkpoints/tiny-base only while the quickstart's pretrain settings hash
    to what the base records; a new trainer setting must not silently make the demo retrain it."""
    import json

    from temper.stages.context import StageContext
    from temper.stages.pretrain import pretrain_hash

    root = Path(__file__).parents[1]
    shipped = json.loads((root / "checkpoints" / "tiny-base" / "pretrain.json").read_text())["hash"]
    for name in ("quickstart.yaml", "grpo_quickstart.yaml", "harness_search_treasure_hunt.yaml"):
        recipe = load_recipe(root / "recipes" / name)
        stage = recipe.stages[0]
        ctx = StageContext(run_dir=root, base_dir=root / "recipes", tasks={}, task_options=recipe.tasks)
        assert stage.cache and pretrain_hash(stage, recipe.model, ctx) == shipped, name


@pytest.mark.parametrize("base", ["small-base", "nano-base"])
def test_the_shipped_size_trend_bases_match_their_recipes(base):
    """checkpoints/small-base (issue 13's stronger base) and nano-base (the small end of the size
    trend) are cache hits of recipes/<name>_base.yaml; small ships bf16 under the 20 MB the
    repository allows a shipped base."""
    import json

    from temper.stages.context import StageContext
    from temper.stages.pretrain import pretrain_hash

    root = Path(__file__).parents[1]
    shipped = json.loads((root / "checkpoints" / base / "pretrain.json").read_text())
    recipe = load_recipe(root / "recipes" / f"{base.replace('-', '_')}.yaml")
    ctx = StageContext(run_dir=root, base_dir=root / "recipes", tasks={}, task_options=recipe.tasks)
    assert pretrain_hash(recipe.stages[0], recipe.model, ctx) == shipped["hash"]
    if base == "small-base":
        assert shipped["shipped_dtype"] == "bfloat16" and shipped["parameters"] == 8_527_616
        assert (root / "checkpoints" / base / "model" / "model.safetensors").stat().st_size < 20e6
