"""experiments/multiseed.py: what a seed changes in a recipe, and the paired-difference interval."""

import importlib.util
import statistics
from pathlib import Path

import pytest
import yaml

_spec = importlib.util.spec_from_file_location(
    "multiseed", Path(__file__).parents[1] / "experiments" / "multiseed.py"
)
multiseed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(multiseed)

RECIPE = """
name: t
model: {preset: nano}
tasks: {arithmetic: {}}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic]}
  - kind: sft
    data: {tasks: [arithmetic]}
  - kind: dpo
    source: sft
    data: {generate: &pairs {tasks: [arithmetic], seed: 7}}
  - kind: sft
    name: chosen
    source: sft
    data: {pairs: *pairs}
"""


def test_a_seed_reaches_the_varied_stages_and_their_generated_pairs_only():
    _, text = multiseed.seeded_recipe(RECIPE, 3, ["dpo", "chosen"])
    stages = {s.get("name", s["kind"]): s for s in yaml.safe_load(text)["stages"]}
    assert stages["dpo"]["train"]["seed"] == 3 and stages["dpo"]["data"]["generate"]["seed"] == 3
    assert stages["chosen"]["data"]["pairs"]["seed"] == 3 and stages["chosen"]["data"]["seed"] == 1003
    assert "train" not in stages["sft"] and "seed" not in stages["sft"]["data"]
    # the alias the stages share: varying one stage leaves the other's pairs seed as written
    _, text = multiseed.seeded_recipe(RECIPE, 3, ["dpo"])
    stages = {s.get("name", s["kind"]): s for s in yaml.safe_load(text)["stages"]}
    assert stages["dpo"]["data"]["generate"]["seed"] == 3 and stages["chosen"]["data"]["pairs"]["seed"] == 7


def test_paired_difference_is_the_mean_with_a_t_interval():
    diffs = [0.01, 0.03, 0.08]
    m, s = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.303 * s / 3**0.5  # t(0.975, 2 df)
    assert multiseed.paired(diffs) == f"{100 * m:+.1f} [{100 * (m - half):+.1f}, {100 * (m + half):+.1f}]"
    assert multiseed.paired([0.02]) == "+2.0"
    with pytest.raises(statistics.StatisticsError):
        multiseed.paired([])
