"""Checkpoint selection: the rule picks on constructed metric tables, bounds are parsed and
refused when malformed, and an end-to-end run picks among an SFT stage's checkpoints."""

import json
from pathlib import Path

import pytest

from temper.models import build_preset, save_model
from temper.recipe import RecipeError, parse_recipe
from temper.runner import run_recipe
from temper.stages.base import StageError
from temper.stages.select import SelectRule, bound_ok, choose

TABLE = {
    "step-0000100": {
        "id_accuracy": 0.40,
        "ood_accuracy": 0.30,
        "parse_rate": 0.9,
        "length": 20.0,
        "kl": 0.05,
    },
    "step-0000200": {
        "id_accuracy": 0.60,
        "ood_accuracy": 0.20,
        "parse_rate": 1.0,
        "length": 14.0,
        "kl": 0.10,
    },
    "step-0000300": {
        "id_accuracy": 0.70,
        "ood_accuracy": 0.25,
        "parse_rate": 1.0,
        "length": 12.0,
        "kl": 0.30,
    },
    "final": {"id_accuracy": 0.70, "ood_accuracy": 0.25, "parse_rate": 1.0, "length": 12.0, "kl": 0.30},
}


def test_the_rule_picks_the_best_feasible_candidate():
    assert choose(TABLE, SelectRule(maximize="ood_accuracy"))[0] == "step-0000100"
    rule = SelectRule(maximize="ood_accuracy", subject_to={"id_accuracy": ">= 0.5"})
    chosen, feasible = choose(TABLE, rule)
    assert chosen == "step-0000300" and feasible == [
        "step-0000200",
        "step-0000300",
        "final",
    ]  # tie: the earlier
    assert choose(TABLE, SelectRule(minimize="length", subject_to={"kl": "< 0.2"}))[0] == "step-0000200"
    assert choose(TABLE, SelectRule(maximize="id_accuracy", subject_to={"kl": "<=0.1"}))[0] == "step-0000200"
    with pytest.raises(StageError, match="no checkpoint meets maximize kl subject to id_accuracy >= 0.9"):
        choose(TABLE, SelectRule(maximize="kl", subject_to={"id_accuracy": ">= 0.9"}))
    # a candidate without the criterion (a task with no ood split) is not chosen for it
    assert (
        choose(
            {"a": {"ood_accuracy": None}, "b": {"ood_accuracy": 0.1}}, SelectRule(maximize="ood_accuracy")
        )[0]
        == "b"
    )


def test_bounds():
    assert bound_ok(0.5, ">= 0.5") and not bound_ok(0.5, "> 0.5") and bound_ok(0.1, "<1e-0")
    assert not bound_ok(None, ">= 0")
    with pytest.raises(ValueError, match="not a bound like"):
        SelectRule(maximize="kl", subject_to={"id_accuracy": "at least 0.5"})
    with pytest.raises(ValueError, match="exactly one of maximize or minimize"):
        SelectRule(maximize="kl", minimize="length")


def _recipe(model: Path, rule: str) -> str:
    return f"""\
name: sel
model: {{path: {model}}}
tasks:
  arithmetic: {{max_digits: 1, ood_digits: 2}}
stages:
  - kind: sft
    data: {{tasks: [arithmetic], problems_per_task: 64, eval_problems: 0}}
    max_len: 48
    train: {{max_steps: 6, batch_size: 8, lr: 0.01, warmup_steps: 0, save_every: 3, progress: false}}
  - kind: select
    rule: {rule}
    n_problems: 8
    kl_problems: 4
    max_new_tokens: 8
"""


def test_end_to_end_a_stage_checkpoints_are_scored_and_one_becomes_the_model(tokenizer, tmp_path):
    start = save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "start")
    with pytest.raises(RecipeError, match="unknown key 'maximise'"):
        parse_recipe(_recipe(start, "{maximise: kl}"))
    run = run_recipe(parse_recipe(_recipe(start, "{minimize: kl}")), tmp_path, tmp_path / "run")
    summary = json.loads((run / "02-select" / "select.json").read_text())
    names = [c["name"] for c in summary["candidates"]]
    assert names == ["step-0000003", "step-0000006", "final"]
    kl = {c["name"]: c["metrics"]["kl"] for c in summary["candidates"]}
    assert summary["reference"] == str(start) and 0 < kl["step-0000003"] < kl["step-0000006"]
    assert kl["step-0000006"] == pytest.approx(
        kl["final"], rel=1e-4
    )  # the last checkpoint is the final model
    assert summary["chosen"] == "step-0000003"  # the least drift from the start
    for c in summary["candidates"]:
        assert set(c["metrics"]) == {"id_accuracy", "ood_accuracy", "parse_rate", "length", "kl"}
    page = (run / "report.html").read_text()
    assert "minimize kl" in page and "candidates (highlighted: chosen)" in page
    # the chosen checkpoint is the stage's model: the same weights as that checkpoint
    import torch

    from temper.models import load_model

    chosen = load_model(run / "02-select" / "model").state_dict()
    saved = torch.load(
        run / "01-sft" / "checkpoints" / "step-0000003" / "pytorch_model.bin", weights_only=True
    )
    assert all(torch.equal(chosen[k], v) for k, v in saved.items() if k in chosen)


def test_candidates_are_checkpoints_then_rounds_then_the_final_model(tmp_path):
    from temper.stages.select import candidates

    for d in (
        "checkpoints/step-0000020",
        "checkpoints/step-0000010",
        "round-02/model",
        "round-01/model",
        "model",
    ):
        (tmp_path / d).mkdir(parents=True)
    for step in ("0000010", "0000020"):
        (tmp_path / "checkpoints" / f"step-{step}" / "state.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-0000030").mkdir()  # no state.json: unfinished, not a candidate
    found = candidates(tmp_path)
    assert [n for n, _ in found] == ["step-0000010", "step-0000020", "round-01", "round-02", "final"]
    assert found[2][1] == tmp_path / "round-01" / "model"
