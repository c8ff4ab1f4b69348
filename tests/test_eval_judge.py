"""A generative judge as an eval metric: `kind: eval` with `judge: {...}` reports each model's mean
verdict, its agreement with the verifier and the unparseable verdicts."""

from __future__ import annotations

import json

import pytest

from temper.cli import main
from temper.evaluate import evaluate, format_table, judge_rows
from temper.rewards.judge import Judge, JudgeSpec
from temper.stages.markers import stage_settings
from test_bad_recipes import BASE, _dry_run  # noqa: E402  (tests/ is on sys.path)
from test_evaluate import KW, _scripted  # noqa: E402

# the scripted answers (test_evaluate.GREEDY / SAMPLED) -> what the stub judge writes: right for
# "ok...", a pass for the wrong "no" (a judge that disagrees), a fail for "boom", nothing readable for "??"
VERDICTS = {"ok": "Score: 10/10", "no": "Score: 7/10", "boom": "[[2]]", "??": "I am not sure."}


class _StubJudge:
    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, chats):
        self.calls.append(len(chats))
        answers = [c[0]["content"].split("[Answer]\n")[1].split("\n\n[Your grade]")[0] for c in chats]
        return [next(v for k, v in VERDICTS.items() if a.startswith(k)) for a in answers]


def test_the_judge_grades_every_answer_once_and_agrees_where_it_should(tokenizer):
    task, sampler = _scripted(tokenizer)
    stub = _StubJudge()
    r = evaluate(
        sampler, tokenizer, task, "test", **{**KW, "max_new_tokens": 8}, judge=Judge(stub, JudgeSpec())
    )
    assert stub.calls == [24]  # 6 greedy + 6 x 3 sampled answers, one call
    j = r["judge"]
    # by hand over the 24 answers: 10 "ok..." (judge 1.0, correct), 8 "no" (0.7: a pass, wrong),
    # 4 "boom" (0.2: a fail; the verifier raised, so wrong), 2 "??" (unreadable, left out)
    assert (j["n"], j["parsed"], j["unparseable"]) == (24, 22, 2)
    assert j["agreement"] == pytest.approx(14 / 22)  # the "ok"s and the "boom"s
    assert j["score"]["value"] == pytest.approx((10 * 1.0 + 8 * 0.7 + 4 * 0.2) / 22)
    # greedy answers: ok, no, boom, ??, ok-long-answer, no
    assert j["greedy_score"]["value"] == pytest.approx((1.0 + 0.7 + 0.2 + 1.0 + 0.7) / 5)
    p_j, p_v = 18 / 22, 10 / 22
    p_e = p_j * p_v + (1 - p_j) * (1 - p_v)
    assert j["kappa"] == pytest.approx((14 / 22 - p_e) / (1 - p_e))
    first = {k: j["examples"][0][k] for k in ("answer", "correct", "verdict", "value")}
    assert first == {"answer": "ok", "correct": True, "verdict": "Score: 10/10", "value": 1.0}
    # the table names the judge's numbers; without a judge there is no judge table
    header, rows = judge_rows({"m": {"test": r}})
    assert header[-1] == "unparseable" and rows[0][-1] == "2 of 24"
    assert "\njudge\n" in format_table({"m": {"test": r}})
    plain = evaluate(sampler, tokenizer, task, "test", **{**KW, "max_new_tokens": 8})
    assert "judge" not in plain and judge_rows({"m": {"test": plain}}) == ([], [])


def _with_judge(tmp_path, judge: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(BASE + f"    judge: {judge}\n")
    return path


@pytest.mark.parametrize(
    ("judge", "key", "message"),
    [
        ("{model: nowhere}", "judge.model", "which is neither an earlier stage"),
        ("{model: policy, scale: [10, 0]}", "judge.scale", "needs lowest < highest"),
        ("{model: policy, fallback: 2}", "judge.fallback", "is a judge value in [0, 1]"),
        ("{model: policy, rubirc: x}", "judge.rubirc", ""),
    ],
)
def test_a_bad_judge_is_refused_at_its_key(tmp_path, capsys, judge, key, message):
    assert _dry_run(_with_judge(tmp_path, judge), tmp_path) == 2
    err = capsys.readouterr().err
    assert any(f"stages[3].{key}" in row and message in row for row in err.splitlines()), err


def test_a_judge_named_by_stage_passes_and_the_hash_covers_it(tmp_path, capsys):
    from temper.recipe import parse_recipe
    from temper.stages.registry import get

    assert _dry_run(_with_judge(tmp_path, "{model: sft}"), tmp_path) == 0, capsys.readouterr().err
    assert "judged by 'sft'" in capsys.readouterr().out
    judged = parse_recipe(_with_judge(tmp_path, "{model: sft}").read_text(), base_dir=tmp_path).stages[3]
    assert get("eval").uses(judged) == [(("judge", "model"), "sft")]
    assert stage_settings(judged)["judge"]["model"] == "sft"
    plain = parse_recipe(BASE, base_dir=tmp_path).stages[3]
    assert (
        "judge" not in stage_settings(plain) and get("eval").uses(plain) == []
    )  # recorded runs keep their hash
    itself = parse_recipe(_with_judge(tmp_path, "{model: policy}").read_text(), base_dir=tmp_path).stages[3]
    assert get("eval").uses(itself) == []


def test_eval_stage_reports_each_models_judge_on_the_tiny_preset(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: judged\nmodel: {preset: nano}\ntasks:\n  arithmetic: {max_digits: 1}\nstages:\n"
        "  - kind: pretrain\n    corpus: {tasks: [arithmetic], problems_per_task: 10}\n"
        "    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}\n"
        "  - kind: sft\n    data: {tasks: [arithmetic], problems_per_task: 10}\n"
        "    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}\n"
        "  - kind: eval\n    splits: [test]\n    n_problems: 3\n    k: 1\n    max_new_tokens: 6\n"
        "    judge: {model: policy, max_new_tokens: 6}\n"
    )
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "run" / "03-eval" / "eval.json").read_text())["arithmetic"]
    assert list(results) == ["pretrain", "sft"]
    for by_split in results.values():
        j = by_split["test"]["judge"]
        assert j["n"] == 3 * (1 + 1) and j["parsed"] + j["unparseable"] == j["n"]
        assert set(j) >= {"agreement", "kappa", "score", "greedy_score", "examples"}
    assert "\njudge\n" in out and "agreement with verifier" in out
    page = (tmp_path / "run" / "report.html").read_text()
    assert "agreement with verifier" in page
