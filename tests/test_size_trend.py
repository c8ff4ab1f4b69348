"""experiments/size_trend.py: bases ordered by size, per-seed spreads and the paired tests."""

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "experiments"))
import size_trend  # noqa: E402  (experiments/, put on the path above)


def _run(root: Path, cell: str, seed: int, base: str, accs: dict[str, tuple[str, str]]) -> None:
    run = root / cell / f"seed-{seed}"
    (run / "05-eval").mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump({"model": {"path": f"../bases/{base}/model"}}))

    def entry(bits):
        return {
            "metrics": {"greedy_accuracy": {"value": bits.count("1") / len(bits)}},
            "greedy_correct": bits,
            "reasons": {"correct": bits.count("1"), "wrong_face_value": bits.count("0")},
        }

    result = {"gp": {m: {"test": entry(t), "ood": entry(o)} for m, (t, o) in accs.items()}}
    (run / "05-eval" / "eval.json").write_text(json.dumps(result))


def test_bases_are_ordered_by_size_and_compared_pair_by_pair(tmp_path):
    recipes = tmp_path / "recipes"
    for base, params in (("big", 8_000_000), ("small", 100_000)):
        (tmp_path / "bases" / base / "model").mkdir(parents=True)
        (tmp_path / "bases" / base / "pretrain.json").write_text(json.dumps({"parameters": params}))
    root = tmp_path / "runs"
    for seed, (sft_ood, rl_ood) in enumerate([("1100", "0111"), ("1000", "0011")]):
        _run(
            root, "path=big", seed, "big", {"sft_branch": ("1111", sft_ood), "grpo_branch": ("1110", rl_ood)}
        )
    _run(root, "path=small", 0, "small", {"sft_branch": ("0000", "0000"), "grpo_branch": ("0000", "0000")})
    recipes.mkdir()
    found = size_trend.bases(root, recipes)
    assert [(name, params, sorted(runs)) for name, params, runs in found] == [
        ("small", 100_000, [0]),
        ("big", 8_000_000, [0, 1]),
    ]
    # ood, pooled over the two seeds: only SFT solves 1 (seed 0, problem 0) + 1 (seed 1, problem 0);
    # only GRPO solves 2 (seed 0) + 2 (seed 1): 2 vs 4, p = 2 * (1 + 6 + 15) / 64 = 0.6875
    assert size_trend.mcnemar(["1100", "1000"], ["0111", "0011"]) == (2, 4, 0.6875)
    assert size_trend.mcnemar(["11"], ["11"]) == (0, 0, 1.0)
    text = size_trend.summarize(found, "gp", "sft_branch", ["grpo_branch"], ["test", "ood"])
    assert "## big (8.00M parameters), seeds [0, 1]" in text
    assert (
        "| grpo_branch | 75.0 ± 0.0 [75.0, 75.0] | 62.5 ± 17.7 [50.0, 75.0] | 62.5 ± 17.7 [50.0, 75.0] |"
        in text
    )
    assert (
        size_trend.rule_followed({"correct": 2, "wrong_value": 1, "wrong_face_value": 9, "wrong_cards": 50})
        == 0.25
    )
    assert size_trend.rule_followed({"wrong_cards": 5}) is None
    assert (
        "| grpo_branch - sft_branch | ood | +25.0 (+25.0, +25.0) [+25.0, +25.0] | 2 vs 4, p = 0.688 |" in text
    )
    # the gap panel: grpo - sft on ood per seed, big: +25, +25 points (no spread); small: 0
    assert size_trend.gaps(found, "gp", "sft_branch", "grpo_branch", "ood") == [
        (100_000, 0.0, 0.0),
        (8_000_000, 25.0, 0.0),
    ]
    assert size_trend.t_interval([1.0, 3.0]) == (2.0, 12.706)  # t(0.975, 1) * sqrt(2) / sqrt(2)
    size_trend.plot(found, "gp", ["test", "ood"], tmp_path / "trend.png", "sft_branch", ["grpo_branch"])
    assert (tmp_path / "trend.png").stat().st_size > 0
