"""experiments/overoptimization.py: rl metrics and best-of-N results into proxy/gold curves over
sqrt(KL), means over seeds, the gold peak, and the seed reaching the eval stages' sampling."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import yaml

_dir = Path(__file__).parents[1] / "experiments"
sys.path.insert(0, str(_dir))  # the script imports its sibling multiseed.py
_spec = importlib.util.spec_from_file_location("overoptimization", _dir / "overoptimization.py")
oo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oo)


def _row(step, kl, proxy, gold):
    return {"step": step, "kl_ref_seq": kl, "reward/reward_model": proxy, "reward/gold": gold}


def test_rl_curve_keeps_the_first_step_then_averages_windows_and_the_last_short_one():
    rows = [_row(1, 0.0, 1.0, 0.5), _row(2, 0.2, 2.0, 0.7), {"step": 2, "eval/accuracy": 0.9}, _row(3, 0.4, 4.0, 0.1),
            _row(4, 1.0, 3.0, 0.2)]  # fmt: skip
    assert oo.rl_curve(rows, 2) == [
        {"kl": 0.0, "proxy": 1.0, "gold": 0.5},
        {"kl": pytest.approx(0.3), "proxy": 3.0, "gold": pytest.approx(0.4)},
        {"kl": 1.0, "proxy": 3.0, "gold": 0.2},
    ]


def test_bon_curve_reads_score_and_accuracy_per_n():
    block = {"n": [1, 4], "kl": [0.0, math.log(4) - 0.75], "score": [{"value": 0.1}, {"value": 0.9}],
             "accuracy": [{"value": 0.6}, {"value": 0.5}]}  # fmt: skip
    got = oo.bon_curve(block)
    assert got[1] == {"n": 4, "kl": pytest.approx(0.636294), "proxy": 0.9, "gold": 0.5}


def test_over_seeds_takes_sqrt_kl_mean_and_std_and_the_gold_peak():
    a = [
        {"kl": 0.0, "proxy": 0.0, "gold": 0.5},
        {"kl": 1.0, "proxy": 1.0, "gold": 0.7},
        {"kl": 4.0, "proxy": 2.0, "gold": 0.3},
    ]
    b = [{"kl": -0.01, "proxy": 0.2, "gold": 0.7}, {"kl": 1.0, "proxy": 1.2, "gold": 0.9}, {"kl": 16.0, "proxy": 3.0, "gold": 0.1}]  # fmt: skip
    mean = oo.over_seeds([a, b])
    assert [r["x"] for r in mean] == pytest.approx([0.0, 1.0, 3.0])  # a negative k1 estimate reads as 0
    assert mean[2]["x_std"] == pytest.approx(math.sqrt(2)) and mean[1]["gold"] == pytest.approx(0.8)
    assert mean[0]["gold_std"] == pytest.approx(math.sqrt(0.02))
    # the proxy's gain from each seed's own start: offsets between seeds' reward models cancel
    assert [r["gain"] for r in mean] == pytest.approx([0.0, 1.0, 2.4]) and mean[0]["gain_std"] == 0.0
    p = oo.peak(mean)
    assert p["index"] == 1 and p["x"] == pytest.approx(1.0) and p["proxy_end"] == pytest.approx(2.5)
    assert p["gold_end"] == pytest.approx(0.2) and p["gold_start"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="different lengths"):
        oo.over_seeds([a, b[:2]])


def test_the_seed_reaches_eval_sampling_and_the_varied_stages_only():
    recipe = """
name: t
model: {preset: nano}
tasks: {arithmetic: {}}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic]}
  - kind: sft
    data: {tasks: [arithmetic]}
  - kind: reward_model
    name: rm
    data: {generate: {tasks: [arithmetic]}}
  - kind: eval
    name: bon
    best_of_n: {rank: reward_model, reward_model: rm, n: [1, 2]}
"""
    stages = {s.get("name", s["kind"]): s for s in yaml.safe_load(oo.seed_text(recipe, 2, ["rm"]))["stages"]}
    assert stages["bon"]["seed"] == 1236 and stages["rm"]["train"]["seed"] == 2
    assert stages["rm"]["data"]["generate"]["seed"] == 2 and "train" not in stages["sft"]
