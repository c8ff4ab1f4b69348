"""The experiment summaries' shared cells (experiments/tables.py) by hand, and the curriculum
summary (experiments/curriculum.py) on a planted two-seed run folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "experiments"))

import curriculum  # noqa: E402  (experiments/, put on the path above)
import tables  # noqa: E402

from temper.envs.code_repair.curriculum import CURRICULUM_REASONS  # noqa: E402


def test_spread_and_the_paired_t_interval_by_hand():
    assert tables.spread([0.1, 0.3], 100, 1) == "20.0 ± 14.1 [10.0, 30.0]"
    # differences 10, 20, 0 pp: mean 10, sample std 10, half-width t(0.975, 2) 10 / sqrt(3) = 24.84
    assert (
        tables.paired([0.1, 0.2, 0.3], [0.2, 0.4, 0.3], 100, 1) == "+10.0 (+10.0, +20.0, +0.0) [-14.8, +34.8]"
    )
    assert tables.paired([0.5], [0.25], 100, 1) == "-25.0 (-25.0)"  # one seed: no interval
    assert tables.table(["a", "b"], [["1", "2"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |"]


def _run(root: Path, seed: int, success: dict[str, list[float]], greedy: dict[str, float], grown: list[dict]):
    run = root / f"seed-{seed}"
    for i, (name, values) in enumerate(success.items(), 3):
        (run / f"0{i}-{name}").mkdir(parents=True)
        rows = [{"step": s + 1, "accuracy": v, "path/all_fail_groups": 1 - v, "episode/turns": 4 + seed + s}
                for s, v in enumerate(values)]  # fmt: skip
        if name == "rl_curriculum":
            rows = [r | g for r, g in zip(rows, grown, strict=True)]
        (run / f"0{i}-{name}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "05-eval").mkdir()
    result = {
        m: {
            s: {"metrics": {"greedy_accuracy": {"value": greedy[m] + (0.1 if s == "train" else 0)}}}
            for s in ("train", "test")
        }
        for m in greedy
    }
    (run / "05-eval" / "eval.json").write_text(json.dumps({"code_repair": result}))


def _grown(admitted: list[int], duplicates: list[int], draws: list[float]) -> list[dict]:
    pool, rows = 10, []
    for a, d, share in zip(admitted, duplicates, draws, strict=True):
        pool += a
        rows.append(
            {
                "curriculum/pool_size": pool,
                "curriculum/generated_share": (pool - 10) / pool,
                "curriculum/admitted": a,
                "curriculum/failed_problems": a + d,
                "curriculum/drawn_generated_share": share,
                **{f"curriculum/rejected/{r}": (d if r == "duplicate" else 0) for r in CURRICULUM_REASONS},
            }
        )
    return rows


def test_the_curriculum_summary_reports_the_pool_share_the_gate_and_the_paired_effect(tmp_path):
    _run(
        tmp_path,
        0,
        {"rl_outcome": [0.2, 0.4, 0.6], "rl_curriculum": [0.2, 0.3, 0.5]},
        {"sft": 0.3, "rl_outcome": 0.4, "rl_curriculum": 0.5},
        _grown([2, 3, 5], [1, 0, 2], [0.0, 0.1, 0.2]),
    )
    _run(
        tmp_path,
        1,
        {"rl_outcome": [0.1, 0.1, 0.3], "rl_curriculum": [0.2, 0.2, 0.2]},
        {"sft": 0.3, "rl_outcome": 0.4, "rl_curriculum": 0.3},
        _grown([0, 0, 4], [0, 0, 0], [0.0, 0.0, 0.0]),
    )
    text = curriculum.summarize(tmp_path, [0, 1], window=1, task="code_repair", splits="train,test")
    assert "| outcome only | 15.0 ± 7.1 [10.0, 20.0] | 45.0 ± 21.2 [30.0, 60.0] |" in text
    assert text.splitlines()[6].endswith("| 6.50 ± 0.71 [6.00, 7.00] |")  # turns at the last step: 6 and 7
    # seed 0: 10 admitted, 3 duplicates, pool 20 (50% generated), draws 10% on average, 20% last
    assert "| 0 | 13 | 10 | 3 | 20 | 50.0 | 10.0; 20.0 |" in text
    assert "| 1 | 4 | 4 | 0 | 14 | 28.6 | 0.0; 0.0 |" in text
    assert "| outcome + curriculum | 50.0 ± 14.1 [40.0, 60.0] | 40.0 ± 14.1 [30.0, 50.0] |" in text
    # test: +10 and -10 pp; t(0.975, 1) = 12.706: 0 ± 12.706 * 14.14 / sqrt 2 = 127.1
    assert "greedy test success +0.0 (+10.0, -10.0) [-127.1, +127.1] pp" in text
    assert "training success at the end -10.0 (-10.0, -10.0) [-10.0, -10.0] pp" in text


def test_a_run_without_curriculum_metrics_is_refused(tmp_path):
    _run(
        tmp_path,
        0,
        {"rl_outcome": [0.2], "rl_curriculum": [0.2]},
        {"sft": 0.3, "rl_outcome": 0.4, "rl_curriculum": 0.5},
        [{}],
    )
    with pytest.raises(SystemExit, match="no curriculum"):
        curriculum.summarize(tmp_path, [0], window=1, task="code_repair", splits="train,test")


def test_all_fail_groups_without_path_signals_are_the_zero_variance_groups_not_all_correct():
    assert (
        curriculum.all_fail(
            {"path/all_fail_groups": 0.25, "zero_variance": 0.5, "zero_variance/all_correct": 0.5}
        )
        == 0.25
    )
    # web_shop logs no path signals: 5/6 groups of one reward, 4/6 of them all correct
    assert curriculum.all_fail({"zero_variance": 5 / 6, "zero_variance/all_correct": 4 / 6}) == pytest.approx(
        1 / 6
    )
