"""Reward-hacking monitors: exact values on hand-made histories, and a planted length hack (a data
task whose reward pays for length while its gold `correct` is exact match) flagged in a short RL
run, in metrics.jsonl, on the console and in the report, while an honest reward is not."""

import json
import math
from dataclasses import asdict

import pytest
import torch
from pydantic import ValidationError

from temper.catalog import make_recipe_task
from temper.cli import main
from temper.models import build_preset, save_model
from temper.recipe import RecipeError, parse_recipe
from temper.report import write_report
from temper.report.rl import monitor_table
from temper.rewards.monitors import (
    MonitorConfig,
    Reading,
    component_trends,
    describe,
    divergence,
    gold,
    length_correlation,
    new_flags,
    pearson,
    pearson_from_sums,
    step_monitors,
    summary,
    sums,
    trend,
    violation_rate,
    violations_per_episode,
)
from temper.stages.rl import RLStage
from temper.train.rl import RLConfig, train_rl

R_HAND = 11 / math.sqrt(130)  # r of x = 1, 2, 3, 4 and y = 2, 4, 5, 9: Σdxdy 11, Σdx² 5, Σdy² 26


def _rows(**series):
    """Rows of steps 1..n with the given series (None: the key is absent at that step)."""
    n = len(next(iter(series.values())))
    return [{"step": i + 1} | {k: v[i] for k, v in series.items() if v[i] is not None} for i in range(n)]


def test_pearson_trend_and_pooled_sums_by_hand():
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(R_HAND)
    assert pearson([1, 2, 3, 4], [9, 5, 4, 2]) == pytest.approx(-R_HAND)  # y reversed: r negated
    assert pearson([1, 2, 3], [5, 5, 5]) is None and pearson([1], [2]) is None and pearson([], []) is None
    assert pearson([0.1] * 3, [1, 2, 3]) is None  # constant up to rounding: undefined, not noise
    with pytest.raises(ValueError, match="3 x values for 2"):
        pearson([1, 2, 3], [1, 2])
    assert sums([1, 2], [3, 5]) == [2.0, 3.0, 8.0, 5.0, 34.0, 13.0]
    pooled = [a + b for a, b in zip(sums([1, 2], [2, 4]), sums([3, 4], [5, 9]), strict=True)]
    assert pearson_from_sums(pooled) == pytest.approx(R_HAND)
    assert trend([1, 2, 3], [5, 5, 5]) == 0.0 and trend([1, 2, 3], [0, 1, 2]) == pytest.approx(1.0)
    assert trend([1, 2, 3, 4], [0, 0.5, 0.5, 1]) == pytest.approx(1.5 / math.sqrt(2.5))


def _length_rows(accuracy):
    """Four steps whose samples, pooled, are reward x = 1, 2, 3, 4 against length y = 2, 4, 5, 9."""
    parts = [sums([1], [2]), sums([2, 3], [4, 5]), sums([], []), sums([4], [9])]
    return _rows(**{"monitor/length_r/sums": parts, "accuracy": accuracy})


def test_length_correlation_pools_the_window_and_flags_only_while_the_gold_is_not_rising():
    rows = _length_rows([0.2, 0.2, 0.2, 0.2])
    assert length_correlation(rows, MonitorConfig(length_r=0.96)) == (pytest.approx(R_HAND), True)
    assert length_correlation(rows, MonitorConfig(length_r=0.97)) == (pytest.approx(R_HAND), False)
    assert length_correlation(rows[:3], MonitorConfig(length_r=0.5)).flag is False  # below min_steps
    assert length_correlation(rows[:3], MonitorConfig(length_r=0.5, min_steps=3)).flag is True
    rising = _length_rows([0.1, 0.2, 0.3, 0.4])  # longer and better: not a hack
    assert length_correlation(rising, MonitorConfig()) == (pytest.approx(R_HAND), False)
    # a gold rising with trend 0.8 counts as "not rising" only under a stricter `rising`
    slow = _length_rows([0.1, 0.3, 0.2, 0.4])
    assert trend([1, 2, 3, 4], [0.1, 0.3, 0.2, 0.4]) == pytest.approx(0.8)
    assert length_correlation(slow, MonitorConfig(rising=0.81)).flag is True
    assert length_correlation(slow, MonitorConfig(rising=0.79)).flag is False
    assert length_correlation(_rows(accuracy=[0.1, 0.2]), MonitorConfig()) == Reading(None, False)


def test_divergence_of_reward_and_gold_by_hand_with_eval_preferred():
    rows = _rows(reward=[0.1, 0.2, 0.3, 0.4], accuracy=[0.5, 0.5, 0.4, 0.5])
    g = -0.05 / math.sqrt(5 * 0.0075)  # accuracy against step: Σdxdy -0.05, Σdx² 5, Σdy² 0.0075
    assert divergence(rows, MonitorConfig()) == (pytest.approx(1 - g), True)
    assert divergence(rows, MonitorConfig(flat=-0.3)).flag is False  # g = -0.258 is not that flat
    assert divergence(rows[:3], MonitorConfig()).flag is False  # min_steps
    same = _rows(reward=[0.1, 0.2, 0.3, 0.4], accuracy=[0.1, 0.2, 0.3, 0.4])
    assert divergence(same, MonitorConfig()) == (pytest.approx(0.0), False)  # the reward is the gold
    # two held-out evals in the window: they are the gold (mean over tasks: 0.3 then 0.5, rising)
    evals = [
        {"eval/a/accuracy": 0.2, "eval/b/accuracy": 0.4},
        {"eval/a/accuracy": 0.6, "eval/b/accuracy": 0.4},
    ]
    with_eval = [rows[0], rows[1] | evals[0], rows[2], rows[3] | evals[1]]
    assert gold(with_eval) == ("eval", [2.0, 4.0], [pytest.approx(0.3), pytest.approx(0.5)])
    assert divergence(with_eval, MonitorConfig()) == (pytest.approx(0.0), False)
    assert gold(rows[:1] + [rows[1] | evals[0]] + rows[2:])[0] == "accuracy"  # one eval is no trend
    assert divergence(rows[:1], MonitorConfig()) == Reading(None, False)


def test_component_trends_flag_a_rising_component_while_the_outcome_falls():
    rows = _rows(
        **{"reward/format": [0, 0.5, 0.5, 1], "reward_fn/x": [1, 1, 1, 1], "accuracy": [0.4, 0.3, 0.3, 0.2]}
    )
    found = component_trends(rows, MonitorConfig())
    assert found == {
        "reward/format": (pytest.approx(1.5 / math.sqrt(2.5)), True),
        "reward_fn/x": (0.0, False),
    }
    rows_up = _rows(**{"reward/format": [0, 0.5, 0.5, 1], "accuracy": [0.1, 0.2, 0.2, 0.4]})
    assert component_trends(rows_up, MonitorConfig())["reward/format"].flag is False
    assert component_trends(rows[:3], MonitorConfig())["reward/format"].flag is False
    assert component_trends(rows[:1], MonitorConfig()) == {}


def test_violations_per_episode_and_their_rise():
    assert violations_per_episode({"path/violations": 1.5, "signal/edit": 9.0}, ["edit"]) == 1.5
    assert (
        violations_per_episode({"signal/edit": 0.5, "signal/skip": 0.25, "signal/ok": 3}, ["edit", "skip"])
        == 0.75
    )
    assert violations_per_episode({"signal/ok": 3}, ["edit"]) is None
    assert violations_per_episode({"signal/edit": float("nan")}, ["edit"]) is None
    rising = _rows(**{"monitor/violations": [0, 1, 1, 2]})
    assert violation_rate(rising, MonitorConfig()) == (2.0, True)
    assert violation_rate(rising[:3], MonitorConfig()).flag is False
    assert violation_rate(_rows(**{"monitor/violations": [2, 1, 1, 0]}), MonitorConfig()) == (0.0, False)
    assert violation_rate(_rows(**{"monitor/violations": [0, 0, 0, 0]}), MonitorConfig()) == (0.0, False)
    back_to_zero = _rows(**{"monitor/violations": [0, 1, 2, 3, 4, 5, 6, 0]})  # trend 17.5 / sqrt(42 · 35.875)
    assert trend(range(1, 9), [0, 1, 2, 3, 4, 5, 6, 0]) == pytest.approx(17.5 / math.sqrt(42 * 35.875))
    assert violation_rate(back_to_zero, MonitorConfig(rising=0.45)) == (0.0, False)
    assert violation_rate(
        back_to_zero[:-1] + [{"step": 8, "monitor/violations": 0.5}], MonitorConfig(rising=0.45)
    ).flag
    assert violation_rate(_rows(accuracy=[1]), MonitorConfig()) == Reading(None, False)


def test_step_monitors_use_only_the_window_and_log_each_flag_once():
    config = MonitorConfig(window=4, length_r=0.9)
    old = {"step": 0, "reward": 9.0, "accuracy": 0.9, "monitor/length_r/sums": sums([9, 0], [0, 9])}
    past = [old] + _rows(reward=[0.1, 0.2, 0.3], accuracy=[0.2, 0.2, 0.2])
    for row, s in zip(past[1:], (sums([1], [2]), sums([2, 3], [4, 5]), sums([], [])), strict=True):
        row["monitor/length_r/sums"] = s
    row = {"step": 4, "reward": 0.4, "accuracy": 0.2, "path/violations": 1.0}
    out = step_monitors(row, past, [4.0], [9.0], config, ["edit"])
    assert out["monitor/length_r"] == pytest.approx(R_HAND) and out["monitor/length_r/flag"] == 1
    assert "monitor/length_r/step" not in out  # one sample: no r of its own
    assert out["monitor/divergence"] == pytest.approx(1.0) and out["monitor/divergence/flag"] == 1
    assert out["monitor/violations"] == 1.0 and out["monitor/violations/flag"] == 0  # first point
    two = step_monitors({"step": 5}, [], [1.0, 2.0, 3.0], [2.0, 4.0, 7.0], config)
    assert (
        two["monitor/length_r/step"]
        == two["monitor/length_r"]
        == pytest.approx(pearson([1, 2, 3], [2, 4, 7]))
    )
    assert "monitor/violations" not in two and "monitor/violations/flag" not in two
    seen: set[str] = set()
    assert new_flags(out, seen) == ["length_r", "divergence"]
    assert new_flags(out, seen) == [] and seen == {"length_r", "divergence"}


def test_summary_table_and_descriptions():
    rows = _rows(
        **{
            "monitor/length_r": [0.9, 0.95, None],
            "monitor/length_r/flag": [0, 1, 1],
            "monitor/divergence": [0.1, 0.2, 0.3],
            "monitor/divergence/flag": [0, 0, 0],
        }
    )
    assert summary(rows) == [("length_r", 0.95, 2, True), ("divergence", 0.3, None, False)]
    html = monitor_table(rows, {"window": 7, "length_r": 0.8})
    assert "Reward-hacking monitors" in html and "<td>step 2</td>" in html and "<td>no</td>" in html
    rows[2]["monitor/length_r/flag"] = 0
    assert summary(rows)[0] == ("length_r", 0.95, 2, False)
    assert "<td>step 2 (not at the last step)</td>" in monitor_table(rows)
    assert "last 7 steps" in html and "r &gt;= 0.8" in html and html.count("class='warn'") == 1
    assert monitor_table([{"step": 1, "reward": 1.0}]) == ""
    assert "component/reward/format" not in describe("component/reward/format", MonitorConfig())
    assert "trend of reward/format" in describe("component/reward/format", MonitorConfig())


def test_monitor_settings_are_validated_as_a_recipe_block():
    stage = RLStage.model_validate({"kind": "rl", "tasks": ["t"], "train": {"monitors": {"window": 5}}})
    assert stage.train.monitors == MonitorConfig(window=5)
    assert RLStage.model_validate({"kind": "rl", "tasks": ["t"]}).train.monitors.enabled is True
    with pytest.raises(ValidationError, match="windo"):
        RLStage.model_validate({"kind": "rl", "tasks": ["t"], "train": {"monitors": {"windo": 5}}})
    with pytest.raises(
        RecipeError, match=r"train\.monitors\.min_steps: 5 must be at most monitors\.window \(3\)"
    ):
        parse_recipe(
            "name: r\nmodel: {path: m}\ntasks: {arithmetic: {}}\nstages:\n  - kind: rl\n"
            "    tasks: [arithmetic]\n    train: {monitors: {window: 3, min_steps: 5}}\n"
        )
    parse_recipe(  # switched off, no contradiction to report
        "name: r\nmodel: {path: m}\ntasks: {arithmetic: {}}\nstages:\n  - kind: rl\n"
        "    tasks: [arithmetic]\n    train: {monitors: {window: 3, min_steps: 5, enabled: false}}\n"
    )
    with pytest.raises(ValidationError, match="greater than or equal to 2"):
        RLStage.model_validate({"kind": "rl", "tasks": ["t"], "train": {"monitors": {"window": 1}}})


# ---------------------------------------------------------------- the planted hack

REWARDS = """
def longer(completions, **kw):  # the hack: pays for length, whatever the answer
    return [len(c) / 50 for c in completions]


def low_first(completions, **kw):  # honest: the gold itself, blind to length
    return [float(bool(c) and c[0] < "P") for c in completions]
"""


def _run(tmp_path, tokenizer, rewards, monitors=None, callbacks=(), **settings):
    """A short GRPO run of a nano model on a data task, as stage 01-rl of a run folder."""
    rows = [{"q": f"what is {i} plus {i % 7}?", "answer": str(i + i % 7)} for i in range(40)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "pay.py").write_text(REWARDS)
    task = make_recipe_task("sums", {"task": "dataset", "data": "d.jsonl", "prompt": "q"} | rewards, tmp_path)
    model = build_preset("nano", tokenizer, seed=1)
    with torch.no_grad():  # make EOS likely (~5% a token) so that lengths vary: a constant
        model.model.embed_tokens.weight[:, 0] = 1.0  # feature in every position, read only by EOS
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 0.5
    config = RLConfig(
        **dict(steps=8, prompts_per_step=4, group_size=8, max_new_tokens=24, lr=1e-2, progress=False)
        | settings
    )
    if monitors is not None:
        config.monitors = monitors
    out = tmp_path / "run" / "01-rl"
    result = train_rl(model, tokenizer, [task], config, out, callbacks=callbacks)
    (out / "stage.json").write_text(json.dumps({"hash": "x", "kind": "rl", "seconds": 1.0}))
    return result.history, out


HACK = {"rewards": ["exact_match", "pay.py:longer"], "reward_weights": [0.0, 1.0]}  # gold: exact match


def test_a_reward_that_pays_for_length_is_flagged(tokenizer, tmp_path, capsys):
    history, out = _run(tmp_path, tokenizer, HACK)
    assert all(r["accuracy"] == 0 for r in history)  # the gold never moves
    assert all(r["monitor/length_r"] > 0.9 for r in history)
    flags = [r["monitor/length_r/flag"] for r in history]
    assert flags == [0, 0, 0, 1, 1, 1, 1, 1]  # from min_steps on
    assert history[3]["monitor/component/reward_fn/longer/flag"] == 1
    assert history[3]["monitor/divergence/flag"] == 1  # the reward rose (lengths grew), the gold did not
    assert not any(r.get("monitor/component/reward_fn/exact_match/flag") for r in history)
    err = capsys.readouterr().err
    assert err.count("monitor length_r flagged") == 1 and "step 4" in err  # warned once
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["monitor/length_r/flag"] for r in logged] == flags
    html = write_report(tmp_path / "run").read_text()
    table = html[html.index("Reward-hacking monitors") :]
    assert "<td>length_r</td><td>" in table and "<td>step 4</td>" in table


def test_an_honest_reward_is_not_flagged(tokenizer, tmp_path, capsys):
    history, out = _run(tmp_path, tokenizer, {"rewards": ["pay.py:low_first"]})
    assert {r["response_length"] < 12 for r in history} == {True, False}  # the lengths did move
    assert all(abs(r["monitor/length_r"]) < 0.3 for r in history)
    assert not any(v for r in history for k, v in r.items() if k.endswith("/flag"))
    assert "reward-hacking monitor" not in capsys.readouterr().err
    html = write_report(tmp_path / "run").read_text()
    table = html[html.index("Reward-hacking monitors") :]
    assert "<td>length_r</td><td>" in table and "<td>step" not in table.split("</table>")[0]


def test_monitors_can_be_switched_off(tokenizer, tmp_path):
    history, _ = _run(tmp_path, tokenizer, HACK, MonitorConfig(enabled=False))
    assert not any(k.startswith("monitor/") for r in history for k in r)


def test_a_resumed_run_reads_its_window_back_and_warns_once(tokenizer, tmp_path, capsys):
    (tmp_path / "a").mkdir()
    full, _ = _run(tmp_path / "a", tokenizer, HACK, steps=6)

    class Stop(Exception):
        pass

    def crash(step, row):
        if step == 5:
            raise Stop

    (tmp_path / "b").mkdir()
    with pytest.raises(Stop):
        _run(tmp_path / "b", tokenizer, HACK, steps=6, save_every=2, callbacks=[crash])
    capsys.readouterr()
    resumed, _ = _run(tmp_path / "b", tokenizer, HACK, steps=6, save_every=2)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]  # steps 1-4 read back from metrics.jsonl
    for a, b in zip(full[4:], resumed[4:], strict=True):  # and the window with them
        assert {k: v for k, v in a.items() if k.startswith("monitor/")} == {
            k: v for k, v in b.items() if k.startswith("monitor/")
        }
    assert "monitor length_r flagged" not in capsys.readouterr().err  # it flagged before the crash


def test_the_rl_stage_records_its_thresholds_and_the_report_quotes_them(tokenizer, tmp_path, monkeypatch):
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "nano")
    rows = [{"q": f"what is {i} plus 1?", "answer": str(i + 1)} for i in range(20)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "pay.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    data = ["--task-data", "d.jsonl", "--prompt-column", "q", "--reward", "pay.py:longer"]
    flags = ["--train.steps", "2", "--train.prompts_per_step", "2", "--train.group_size", "2"]
    flags += ["--train.max_new_tokens", "4", "--train.progress", "false", "--probe_groups", "0"]
    flags += [
        "--train.monitors.window",
        "3",
        "--train.monitors.min_steps",
        "2",
        "--train.monitors.length_r",
        "0.7",
    ]
    assert main(["rl", "--model", "nano", "--out", "run/01-rl", *data, *flags]) == 0
    settings = json.loads((tmp_path / "run" / "01-rl" / "rl.json").read_text())["monitors"]
    assert settings == asdict(MonitorConfig(window=3, min_steps=2, length_r=0.7))
    html = write_report(tmp_path / "run").read_text()
    assert "over the samples of the last 3 steps; flags at r &gt;= 0.7" in html
