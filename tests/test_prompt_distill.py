"""Prompt distillation: the forward-KL loss by hand and against TRL's GKD loss (beta = 0), the
instructed task's rule and prompts, the teacher's tokenizer check, and a micro run in which a
student reading no instruction learns to do what the teacher does when it reads one."""

from __future__ import annotations

import json
import math

import pytest
import torch

from temper.algorithms.distill import forward_kl_loss
from temper.catalog import make_task
from temper.data.dataset import build_sequences
from temper.data.formats import Example
from temper.models import build_preset, build_tokenizer, save_model
from temper.stages.base import StageError
from temper.stages.context import StageContext
from temper.stages.prompt_distill import (
    Instructed,
    PromptDistillStage,
    prompt_distill_table,
    run_prompt_distill,
    with_system,
)
from temper.tasks.base import Problem, Score
from temper.train import NextToken
from temper.train.supervised import TrainConfig, train_supervised

F64 = torch.float64


def test_forward_kl_by_hand():
    # two positions, two tokens; the second position is masked out
    teacher = torch.tensor([[[0.0, math.log(3.0)], [5.0, -5.0]]], dtype=F64)  # p_T = (1/4, 3/4)
    student = torch.tensor([[[0.0, 0.0], [-5.0, 5.0]]], dtype=F64)  # p_S = (1/2, 1/2)
    mask = torch.tensor([[True, False]])
    by_hand = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)  # 0.1308 nats
    assert forward_kl_loss(student, teacher, mask).item() == pytest.approx(by_hand, abs=1e-12)
    assert forward_kl_loss(teacher, teacher, torch.ones(1, 2, dtype=torch.bool)).item() == pytest.approx(
        0, abs=1e-12
    )
    # temperature 2: both distributions softened before the KL
    soft_t, soft_s = (1 / (1 + 3**0.5), 3**0.5 / (1 + 3**0.5)), (0.5, 0.5)
    soft = sum(p * math.log(p / q) for p, q in zip(soft_t, soft_s, strict=True))
    assert forward_kl_loss(student, teacher, mask, temperature=2.0).item() == pytest.approx(soft, abs=1e-12)
    assert forward_kl_loss(student, teacher, torch.zeros(1, 2, dtype=torch.bool)).item() == 0.0


def test_forward_kl_matches_trl_gkd_with_beta_zero():
    GKDTrainer = pytest.importorskip("trl.experimental.gkd").GKDTrainer
    g = torch.Generator().manual_seed(0)
    student = torch.randn(3, 5, 11, generator=g, dtype=F64)
    teacher = torch.randn(3, 5, 11, generator=g, dtype=F64) * 2
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, 3:] = -100
    labels[2, :] = -100
    for temperature in (1.0, 0.7):
        ours = forward_kl_loss(student, teacher, labels != -100, temperature=temperature)
        trl = GKDTrainer.generalized_jsd_loss(
            student, teacher, labels=labels, beta=0, temperature=temperature
        )
        assert ours.item() == pytest.approx(trl.item(), rel=1e-10)


def test_only_the_student_gets_a_gradient():
    student = torch.randn(2, 3, 4, dtype=F64, requires_grad=True)
    teacher = torch.randn(2, 3, 4, dtype=F64, requires_grad=True)
    forward_kl_loss(student, teacher, torch.ones(2, 3, dtype=torch.bool)).backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None


def test_the_instructed_task_grades_the_rule_with_and_without_the_system_turn():
    rule, bare = make_task("instructed_arithmetic"), make_task("instructed_arithmetic", system=False)
    with_rule, without = rule.sample("test", 20, 3), bare.sample("test", 20, 3)
    assert [p.id for p in with_rule] == [p.id for p in without]  # the same questions
    assert with_rule[0].messages()[0]["role"] == "system" and len(without[0].messages()) == 1
    p = next(q for q in without if abs(q.data["result"]) >= 10)
    assert bare.score(p, f"x\nAnswer: {abs(p.data['result']) % 10}").correct
    assert not bare.score(p, f"x\nAnswer: {p.data['result']}").correct  # the full result breaks the rule
    assert bare.demonstration(p).endswith(f"Answer: {abs(p.data['result']) % 10}")
    neg = make_task("instructed_arithmetic", ops=["-"]).sample("train", 50, 0)
    assert any(
        q.data["result"] < 0 and q.data["answer"] == -q.data["result"] % 10
        for q in neg
        if q.data["result"] > -10
    )
    with pytest.raises(ValueError, match="non-empty instruction"):
        make_task("instructed_arithmetic", instruction=" ")


def test_grade_rule_scores_obedience_whatever_the_arithmetic():
    task = make_task("instructed_arithmetic", system=False, grade="rule")
    p = Problem("instructed_arithmetic", "test", "37+45", "37+45=?", {"result": 82, "answer": 2})
    assert task.score(p, "37+45=82\nAnswer: 2").correct
    assert task.score(p, "37+45=81\nAnswer: 1").correct  # wrong sum, rule obeyed
    assert not task.score(p, "37+45=81\nAnswer: 2").correct  # not the last digit of what it wrote
    assert not task.score(p, "37+45=82\nAnswer: 82").correct  # the full result: rule ignored
    assert task.score(p, "Answer: 2").correct  # no equation written: the true result's digit
    q = Problem("instructed_arithmetic", "test", "12-19", "12-19=?", {"result": -7, "answer": 7})
    assert task.score(q, "12-19=-7\nAnswer: 7").correct and not task.score(q, "12-19=-7\nAnswer: -7").correct
    assert task.score(q, "no answer").reward == 0 and not task.score(q, "no answer").parsed
    strict = make_task("instructed_arithmetic", system=False)
    assert not strict.score(p, "37+45=81\nAnswer: 1").correct


def test_with_system_adds_the_instruction_for_the_teacher_only():
    msgs = [{"role": "user", "content": "q"}]
    assert with_system(msgs, "RULE") == [{"role": "system", "content": "RULE"}] + msgs
    assert msgs == [{"role": "user", "content": "q"}]
    had = [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}]
    assert with_system(had, "RULE")[0]["content"] == "RULE\n\nold"
    task = make_task("instructed_arithmetic", system=False)
    view = Instructed(task, "RULE")
    assert view.sample("test", 2, 0)[0].messages()[0] == {"role": "system", "content": "RULE"}
    assert view.name == task.name and view.score is not None


RULE = "Rule: answer with a digit."


class DigitTask:
    """Correct when the completion starts with a digit; the prompts never say so."""

    name = "digit"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{split}-{seed}-{i}", f"q{(seed + i) % 7}") for i in range(n)]

    def score(self, problem, completion):
        ok = bool(completion) and completion[0].isdigit()
        return Score(float(ok), ok, bool(completion), {"reason": "correct" if ok else "wrong"})

    def demonstration(self, problem):
        return "A"

    def corpus_text(self, problem):
        return problem.prompt


def _obedient_model(tokenizer, tmp_path):
    """A nano model that answers a digit when the system turn states RULE, and `A` otherwise."""
    task = DigitTask()
    examples = []
    for i, p in enumerate(task.sample("train", 64, 0)):
        examples.append(Example("t", 2 * i, messages=p.messages() + [{"role": "assistant", "content": "A"}]))
        ruled = with_system(p.messages(), RULE) + [{"role": "assistant", "content": str(i % 10)}]
        examples.append(Example("t", 2 * i + 1, messages=ruled))
    sequences, _ = build_sequences(tokenizer, examples, 64)
    model = build_preset("nano", tokenizer, seed=4)
    config = TrainConfig(max_steps=60, batch_size=16, lr=1e-2, warmup_steps=2, progress=False)
    train_supervised(
        model, sequences, config, tmp_path / "teacher-train", objective=NextToken(tokenizer.pad_token_id)
    )
    return save_model(model.eval(), tokenizer, tmp_path / "start")


def _stage(**kw):
    base = dict(
        kind="prompt_distill",
        tasks=["digit"],
        system=RULE,
        prompts=32,
        k=2,
        max_new_tokens=2,
        eval_problems=32,
        train=TrainConfig(max_steps=30, batch_size=8, lr=1e-2, warmup_steps=1, progress=False),
    )
    return PromptDistillStage(**(base | kw))


def test_the_student_learns_to_obey_without_the_instruction(tokenizer, tmp_path):
    start = _obedient_model(tokenizer, tmp_path)
    ctx = StageContext(tmp_path, tmp_path, {"digit": DigitTask()}, {})
    out = tmp_path / "out"
    out.mkdir()
    run_prompt_distill(_stage(), ctx, start, out)
    s = json.loads((out / "prompt_distill.json").read_text())
    assert s["before"]["with"]["digit"] > 0.9 and s["before"]["without"]["digit"] < 0.1, s["before"]
    assert s["after"]["without"]["digit"] > 0.9, s["after"]
    assert s["after"]["with"]["digit"] > 0.9, s["after"]
    # the student starts far from the teacher (it reads no rule), and closes most of the gap
    assert s["kl_first"] > 0.2 and s["kl_last"] < s["kl_first"] / 2, (s["kl_first"], s["kl_last"])
    assert s["samples"] == 64 and s["teacher_sample_accuracy"] > 0.8
    assert "without" in prompt_distill_table(out) and (out / "model" / "config.json").exists()
    from temper.report.common import Stage
    from temper.report.prompt_distill import prompt_distill_section

    html = prompt_distill_section(Stage(out, "prompt_distill", None), tmp_path)
    assert "greedy accuracy" in html and "<img" in html


def test_an_interrupted_stage_resumes_to_the_uninterrupted_result(tokenizer, tmp_path, monkeypatch, capsys):
    """Interrupted right after its checkpoint at step 12 of 24, the rerun resumes there: the same
    weights, metrics rows and KL summary (its first steps' mean: steps before the resume) as a
    run that never stopped."""
    import temper.train.supervised as supervised
    from temper.models import load_model

    start = save_model(build_preset("nano", tokenizer, seed=4), tokenizer, tmp_path / "start")
    ctx = StageContext(tmp_path, tmp_path, {"digit": DigitTask()}, {})
    train = TrainConfig(
        max_steps=24, batch_size=8, lr=1e-2, warmup_steps=1, save_every=12, log_every=6, progress=False
    )
    stage = _stage(train=train, eval_problems=8)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    run_prompt_distill(stage, ctx, start, whole)

    save = supervised.save_checkpoint

    def save_then_stop(root, step, accelerator, **kwargs):
        save(root, step, accelerator, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(supervised, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_prompt_distill(stage, ctx, start, cut)
    monkeypatch.setattr(supervised, "save_checkpoint", save)
    capsys.readouterr()
    run_prompt_distill(stage, ctx, start, cut)
    assert f"cut: resuming from step 12 ({cut / 'checkpoints' / 'step-0000012'})" in capsys.readouterr().err

    for a, b in zip(
        load_model(whole / "model").parameters(), load_model(cut / "model").parameters(), strict=True
    ):
        assert torch.equal(a, b)

    def rows(folder):
        return [
            {k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (folder / "metrics.jsonl").read_text().splitlines()
        ]

    assert [r["step"] for r in rows(cut)] == [6, 12, 18, 24] and rows(cut) == rows(whole)
    got, want = (json.loads((f / "prompt_distill.json").read_text()) for f in (cut, whole))
    assert {k: v for k, v in got.items() if k != "seconds"} == {
        k: v for k, v in want.items() if k != "seconds"
    }
    assert got["kl_first"] != got["kl_last"] and got["steps"] == 24


def test_a_teacher_with_another_tokenizer_is_refused(tokenizer, tmp_path):
    save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "student")
    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    save_model(build_preset("nano", other, seed=2), other, tmp_path / "teacher")
    ctx = StageContext(tmp_path, tmp_path, {"digit": DigitTask()}, {})
    (tmp_path / "out").mkdir()
    with pytest.raises(StageError, match=r"prompt_distill: teacher './teacher' .* do not share a tokenizer"):
        run_prompt_distill(_stage(teacher="./teacher"), ctx, tmp_path / "student", tmp_path / "out")


def test_the_spec_refuses_an_empty_instruction_and_epochs():
    with pytest.raises(ValueError, match="instruction to distill is empty"):
        _stage(system="  ")
    with pytest.raises(ValueError, match="give train.max_steps"):
        _stage(train=TrainConfig(epochs=1.0, progress=False))


RECIPE = """\
name: pd
model: {{path: ./student}}
tasks:
  bare: {{task: instructed_arithmetic, system: false, grade: rule}}
stages:
  - kind: sft
    name: teacher
    data: {{tasks: [bare], problems_per_task: 8}}
    train: {{max_steps: 2, batch_size: 4, warmup_steps: 0}}
  - kind: prompt_distill
    tasks: [{task}]
    system: "RULE"
{teacher}    train: {{max_steps: 2, batch_size: 4, warmup_steps: 0}}
"""


def test_the_recipe_checks_the_teacher_and_tasks_and_the_hash_covers_the_teacher(tmp_path):
    from temper.recipe import RecipeError, parse_recipe
    from temper.runner import _stage_hash

    (tmp_path / "student").mkdir()

    def parse(task="bare", teacher="    teacher: teacher\n"):
        return parse_recipe(RECIPE.format(task=task, teacher=teacher), "pd.yaml", base_dir=tmp_path)

    recipe = parse()
    assert recipe.stages[1].teacher == "teacher" and parse(teacher="").stages[1].teacher is None
    with pytest.raises(RecipeError, match=r"stages\[1\]\.teacher"):
        parse(teacher="    teacher: techer\n")
    with pytest.raises(RecipeError, match="bar"):
        parse(task="bar")
    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={}, task_options=recipe.tasks)
    ctx.models["teacher"] = tmp_path / "t"
    ctx.model_hashes["teacher"] = ctx.output_hashes["teacher"] = "aaaa"
    first = _stage_hash(recipe, 1, ctx)
    ctx.output_hashes["teacher"] = "bbbb"
    assert _stage_hash(recipe, 1, ctx) != first
