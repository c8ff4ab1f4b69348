"""experiments/r1_zero.py: training curves by block, the stages' own evals and the final table."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "experiments"))
import r1_zero  # noqa: E402  (experiments/, put on the path above)


def _stage(run: Path, folder: str, rows: list[dict]) -> None:
    (run / folder).mkdir(parents=True)
    (run / folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _seed(root: Path, seed: int, zero_parse: list[float], final: dict[str, tuple[float, float]]) -> None:
    run = root / f"seed-{seed}"
    zero = [
        {"step": i + 1, "parse_rate": p, "reward": 0.2 * p, "accuracy": 0.0} for i, p in enumerate(zero_parse)
    ]
    zero[1] |= {"eval/arithmetic/accuracy": 0.01 * seed, "eval/arithmetic/parse_rate": 0.5}
    cold = [{"step": i + 1, "parse_rate": 1.0, "reward": 1.2 * 0.5, "accuracy": 0.5} for i in range(4)]
    cold[1] |= {"eval/arithmetic/accuracy": 0.4, "eval/arithmetic/parse_rate": 1.0}
    _stage(run, "02-zero", zero)
    _stage(run, "04-after_cold_start", cold)
    (run / "05-eval").mkdir()
    metrics = {
        m: {"test": {"metrics": {"greedy_accuracy": {"value": a}, "parse_rate": {"value": p}}}}
        for m, (a, p) in final.items()
    }
    (run / "05-eval" / "eval.json").write_text(json.dumps({"arithmetic": metrics}))


def test_blocks_cover_every_step_and_means_are_per_block():
    assert r1_zero.blocks(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert r1_zero.block_means([0.0, 1.0, 1.0, 1.0, 0.5], r1_zero.blocks(5, 2)) == [0.5, 1.0, 0.5]


def test_the_summary_has_the_final_table_the_paired_gaps_and_the_curves(tmp_path):
    final0 = {
        "midtrain": (0.0, 0.5),
        "zero": (0.0, 0.75),
        "cold_start": (0.25, 1.0),
        "after_cold_start": (0.5, 1.0),
    }
    final1 = {
        "midtrain": (0.0, 0.25),
        "zero": (0.1, 0.75),
        "cold_start": (0.25, 1.0),
        "after_cold_start": (0.3, 1.0),
    }
    _seed(tmp_path, 0, [0.0, 0.5, 1.0, 1.0], final0)
    _seed(tmp_path, 1, [0.5, 0.5, 0.5, 1.0], final1)
    text = r1_zero.summarize(
        tmp_path, [0, 1], 2, "arithmetic", str(tmp_path / "curves.png"), "zero,after_cold_start"
    )
    assert "| zero | 5.0 ± 7.1 [0.0, 10.0] | 75.0 ± 0.0 [75.0, 75.0] |" in text
    # zero - midtrain parse per seed: +25, +50; cold start + GRPO - zero accuracy: +50, +20
    assert "zero - midtrain accuracy +5.0 (+0.0, +10.0) [-58.5, +68.5], parse +37.5 (+25.0, +50.0) [" in text
    assert "after_cold_start - zero accuracy +35.0 (+50.0, +20.0) [" in text
    # zero's parse rate by block of 2 steps: seed 0 (0.25, 1.0), seed 1 (0.5, 0.75)
    assert (
        "| zero (GRPO from the mid-trained base) | 37.5 ± 17.7 [25.0, 50.0] | 87.5 ± 17.7 [75.0, 100.0] |"
        in text
    )
    # zero's reward (0.2 x parse) by block: seed 0 (0.05, 0.2), seed 1 (0.1, 0.15), shown as is
    assert "| 0.075 ± 0.035 [0.050, 0.100] | 0.175 ± 0.035 [0.150, 0.200] |" in text
    # the stages' own evals at step 2: zero accuracy 0 and 1% / parse 50%
    assert (
        "| zero (GRPO from the mid-trained base) | 0.5 ± 0.7 [0.0, 1.0] / 50.0 ± 0.0 [50.0, 50.0] |" in text
    )
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_arm = r1_zero.summarize(tmp_path, [0, 1], 2, "arithmetic", None, "zero")  # a zero-only sweep
    assert "cold start SFT + GRPO" not in one_arm and "| zero (GRPO from the mid-trained base) |" in one_arm
