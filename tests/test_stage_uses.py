"""A stage's reference to a reward model (rl `train.reward_model`, eval `best_of_n.reward_model`,
sft `data.best_of_n.reward_model`) is declared in `StageKind.uses` like any other reference to an
earlier stage's output. The stage hashes are those the kinds' own fingerprint gave before the
references moved there: the literals below were computed by main at 36c2b11, so a finished stage
folder of an earlier run is still complete."""

import re

import pytest

from temper.recipe import parse_recipe
from temper.runner import _stage_hash
from temper.stages.context import StageContext

RECIPE = """\
name: h
model: {path: policy}
tasks: {arithmetic: {max_digits: 2}}
stages:
  - kind: reward_model
    name: rm
    data: {generate: {tasks: [arithmetic]}}
  - kind: rl
    tasks: [arithmetic]
    train: {steps: 2, rewards: {reward_model: 1.0}, reward_model: RM}
  - kind: sft
    data: {best_of_n: {tasks: [arithmetic], rank: reward_model, reward_model: RM}}
  - kind: eval
    best_of_n: {n: [1, 2], rank: reward_model, reward_model: RM}
  - kind: eval
    name: plain
    best_of_n: {n: [1, 2]}
"""

# the reference -> the hashes of stages 2-5 (rl, sft, eval, eval without a reward model) at 36c2b11
GOLDEN = {
    "rm": ["82deb54f2c3ae5e0", "66624ab43a913d45", "04f55ad2522fb408", "ebc5cead022a7d3d"],
    "rm_dir": ["37ac07f4b189636e", "cf01ae96929b18b3", "85a36ef9cd30fad6", "ebc5cead022a7d3d"],
}


def _hashes(tmp_path, ref: str, weights: bytes = b"weights v1") -> list[str]:
    (tmp_path / "policy").mkdir(exist_ok=True)
    for folder in (tmp_path / "run" / "01-rm" / "reward_model", tmp_path / "rm_dir"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(weights)
        (folder / "config.json").write_text("{}")
    recipe = parse_recipe(RECIPE.replace("RM", ref), base_dir=tmp_path)
    ctx = StageContext(run_dir=tmp_path / "run", base_dir=tmp_path, tasks={}, task_options=recipe.tasks)
    ctx.stage_dirs["rm"] = tmp_path / "run" / "01-rm"
    ctx.output_hashes["rm"] = "0123456789abcdef"
    return [_stage_hash(recipe, i, ctx) for i in range(1, 5)]


@pytest.mark.parametrize("ref", ["rm", "rm_dir"])
def test_reward_model_references_keep_their_stage_hashes(tmp_path, ref):
    assert _hashes(tmp_path, ref) == GOLDEN[ref]


def test_the_reward_models_files_are_in_the_hash_of_every_stage_that_reads_it(tmp_path):
    for ref in ("rm", "rm_dir"):
        before, after = _hashes(tmp_path, ref), _hashes(tmp_path, ref, b"weights v2")
        assert all(a != b for a, b in zip(before[:3], after[:3])) and before[3] == after[3]


@pytest.mark.parametrize(
    ("stage", "key"),
    [
        ("  - kind: rl\n    tasks: [arithmetic]\n    train: {steps: 2, rewards: {reward_model: 1.0}, reward_model: REF}\n",
         "train.reward_model"),
        ("  - kind: sft\n    data: {best_of_n: {tasks: [arithmetic], rank: reward_model, reward_model: REF}}\n",
         "data.best_of_n.reward_model"),
        ("  - kind: eval\n    best_of_n: {n: [1, 2], rank: reward_model, reward_model: REF}\n",
         "best_of_n.reward_model"),
    ],
)  # fmt: skip
def test_a_reward_model_reference_is_checked_where_it_is_written(tmp_path, stage, key):
    from temper.recipe import RecipeError

    head = "name: h\nmodel: {path: policy}\ntasks: {arithmetic: {max_digits: 2}}\nstages:\n"
    rm = "  - kind: reward_model\n    name: rm\n    data: {generate: {tasks: [arithmetic]}}\n"
    sft = "  - kind: sft\n    name: tuned\n    data: {tasks: [arithmetic]}\n"
    (tmp_path / "policy").mkdir()
    (tmp_path / "saved_rm").mkdir()
    for ref in ("rm", "saved_rm"):  # an earlier reward_model stage, a folder
        parse_recipe(head + rm + sft + stage.replace("REF", ref), base_dir=tmp_path)
    for ref, message in [
        ("tuned", "stage 'tuned' is a sft stage, not a reward_model stage"),
        ("nowhere", "'nowhere' is neither an earlier reward_model stage ['rm'] nor a folder"),
    ]:
        with pytest.raises(RecipeError, match=re.escape(f"stages[2].{key}: {message}")):
            parse_recipe(head + rm + sft + stage.replace("REF", ref), base_dir=tmp_path)
