"""On-policy distillation: the reverse-KL advantage by hand and against tinker-cookbook's formula,
its expected gradient is the reverse KL's, the teacher's recipe rules, the tokenizer check, the
stage hash covering the teacher, and a micro run where the student's KL to the teacher falls."""

from __future__ import annotations

import json

import pytest
import torch

from fakes import FirstByteTask
from temper.algorithms.distill import reverse_kl_advantages
from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
from temper.models import build_preset, build_tokenizer, save_model
from temper.recipe import RecipeError, parse_recipe
from temper.stages.base import StageError
from temper.stages.context import StageContext
from temper.stages.rl import RLStage, run_rl, tokenizer_mismatch
from temper.train.rl import RLConfig

F64 = torch.float64


def test_advantages_by_hand():
    k1 = torch.tensor([[0.5, -0.1, 9.0], [0.2, 0.3, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    mean = (0.5 - 0.1 + 0.2 + 0.3 + 0.0) / 5  # the padding's 9.0 is not counted
    want = torch.tensor([[mean - 0.5, mean + 0.1, 0.0], [mean - 0.2, mean - 0.3, mean - 0.0]], dtype=F64)
    torch.testing.assert_close(reverse_kl_advantages(k1, mask), want)
    torch.testing.assert_close(reverse_kl_advantages(k1, mask, coef=2.0), 2 * want)
    # a token the teacher likes more than the student (k1 < mean) is pushed up
    assert reverse_kl_advantages(k1, mask)[0, 1] > 0 > reverse_kl_advantages(k1, mask)[0, 0]


def test_matches_tinker_cookbook_incorporate_kl_penalty():
    """tinker_cookbook.rl.metrics.incorporate_kl_penalty with kl_discount_factor 0, reimplemented:
    diffs = (sampled_logprobs - teacher_logprobs) * mask; avg = sum(diffs) / sum(mask);
    advantages += kl_coef * mask * (avg - diffs)."""
    g = torch.Generator().manual_seed(3)
    student = -torch.rand(4, 6, generator=g, dtype=F64) * 3
    teacher = -torch.rand(4, 6, generator=g, dtype=F64) * 3
    mask = torch.rand(4, 6, generator=g) > 0.3
    m = mask.to(F64)
    diffs = (student - teacher) * m
    avg = diffs.sum() / m.sum()
    tinker = 0.7 * m * (avg - diffs)
    x = AdvantageInputs(
        rewards_G_N=torch.zeros(2, 2, dtype=F64),
        mask_R_T=mask,
        ref_kl_R_T=(student - teacher) * m,
        kl_coef=0.7,
    )
    advantages, returns = ESTIMATORS["on_policy_distill"](x)
    torch.testing.assert_close(advantages, tinker)
    assert returns is None
    # the rewards are not used: distillation learns from the teacher alone
    other = AdvantageInputs(**{**x.__dict__, "rewards_G_N": torch.ones(2, 2, dtype=F64)})
    torch.testing.assert_close(ESTIMATORS["on_policy_distill"](other)[0], advantages)


def test_expected_policy_gradient_is_minus_the_reverse_kl_gradient():
    """Exact expectation over a 5-token vocabulary: E_{y~p}[A(y) grad log p(y)] with the centred
    advantage -(log p - log q) equals -grad KL(p || q); the baseline changes nothing."""
    torch.manual_seed(0)
    theta = torch.randn(5, dtype=F64, requires_grad=True)
    log_q = torch.log_softmax(torch.randn(5, dtype=F64), -1)
    log_p = torch.log_softmax(theta, -1)
    p = log_p.exp().detach()
    k1 = (log_p - log_q).detach()
    baseline = (p * k1).sum()  # the expectation of the batch mean
    surrogate = (p * (baseline - k1) * log_p).sum()  # E_y[A(y) log p(y)], A treated as a constant
    (pg,) = torch.autograd.grad(surrogate, theta)
    log_p = torch.log_softmax(theta, -1)  # a fresh graph
    kl = (log_p.exp() * (log_p - log_q)).sum()
    (kl_grad,) = torch.autograd.grad(kl, theta)
    torch.testing.assert_close(pg, -kl_grad)


RECIPE = """\
name: opd
model: {{path: ./student}}
tasks:
  arithmetic: {{max_digits: 1}}
stages:
  - kind: sft
    name: teacher
    data: {{tasks: [arithmetic], problems_per_task: 8}}
    train: {{max_steps: 2, batch_size: 4, warmup_steps: 0}}
  - kind: rl
    name: distill
    tasks: [arithmetic]
    source: {source}
{teacher}    train: {{steps: 2, prompts_per_step: 2, group_size: 2, advantage: {advantage}, kl_coef: {kl_coef}, kl_mode: {kl_mode}}}
"""


def _recipe(
    tmp_path,
    teacher="    teacher: teacher\n",
    advantage="on_policy_distill",
    kl_coef=1.0,
    kl_mode="reward",
    source="teacher",
):
    (tmp_path / "student").mkdir(exist_ok=True)
    text = RECIPE.format(
        teacher=teacher, advantage=advantage, kl_coef=kl_coef, kl_mode=kl_mode, source=source
    )
    return parse_recipe(text, "opd.yaml", base_dir=tmp_path)


def test_recipe_accepts_an_earlier_stage_as_teacher(tmp_path):
    assert _recipe(tmp_path).stages[1].teacher == "teacher"
    assert _recipe(tmp_path, teacher="    teacher: ./student\n").stages[1].teacher == "./student"
    assert _recipe(tmp_path, teacher="    teacher: org/some-model\n")  # a hub id is checked when loaded


@pytest.mark.parametrize(
    "kw, where, words",
    [
        (dict(teacher=""), "stages[1].teacher", "needs a teacher"),
        (dict(kl_coef=0.0), "stages[1].train.kl_coef", "must be > 0"),
        (dict(kl_mode="loss"), "stages[1].train.kl_mode", "counted twice"),
        (dict(advantage="grpo", kl_coef=0.0), "stages[1].teacher", "kl_coef > 0"),
        (dict(teacher="    teacher: distill\n"), "stages[1].teacher", "a later stage"),
        (dict(teacher="    teacher: techer\n"), "stages[1].teacher", "neither an earlier stage ['teacher']"),
    ],
)
def test_recipe_refuses_a_teacher_it_cannot_use(tmp_path, kw, where, words):
    with pytest.raises(RecipeError) as err:
        _recipe(tmp_path, **kw)
    assert where in str(err.value) and words in str(err.value), str(err.value)


def test_the_stage_hash_covers_the_teacher(tmp_path):
    from temper.runner import _stage_hash

    recipe = _recipe(tmp_path, source="teacher")
    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={}, task_options=recipe.tasks)
    ctx.models["teacher"] = tmp_path / "t"
    ctx.model_hashes["teacher"] = ctx.output_hashes["teacher"] = "aaaa"
    first = _stage_hash(recipe, 1, ctx)
    ctx.output_hashes["teacher"] = "bbbb"  # the teacher retrained, the student's source unchanged
    assert _stage_hash(recipe, 1, ctx) != first


def test_tokenizer_mismatch_names_the_difference(tokenizer):
    assert tokenizer_mismatch(tokenizer, build_tokenizer()) == ""
    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    assert "vocabularies of" in tokenizer_mismatch(tokenizer, other)


def _stage(teacher: str, **train) -> RLStage:
    config = dict(
        steps=10, prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-2, seed=0, progress=False
    )
    return RLStage(
        kind="rl",
        tasks=["first_byte"],
        teacher=teacher,
        probe_groups=0,
        train=RLConfig(
            **(config | dict(advantage="on_policy_distill", kl_coef=1.0, kl_mode="reward") | train)
        ),
    )


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path, tokenizer):
    save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "student")
    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    save_model(build_preset("nano", other, seed=2), other, tmp_path / "teacher")
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    (tmp_path / "out").mkdir()
    with pytest.raises(StageError, match="do not share a tokenizer: vocabularies of"):
        run_rl(_stage("teacher"), ctx, tmp_path / "student", tmp_path / "out")


def test_the_students_kl_to_the_teacher_falls(tmp_path, tokenizer):
    torch.manual_seed(0)
    save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "student")
    teacher = build_preset("nano", tokenizer, seed=2)
    with torch.no_grad():  # sharpen its logits: a confident teacher, far from the near-uniform student
        teacher.model.norm.weight.mul_(30.0)
    save_model(teacher, tokenizer, tmp_path / "teacher")
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    out = tmp_path / "out"
    out.mkdir()
    run_rl(_stage("teacher", steps=16, lr=3e-2), ctx, tmp_path / "student", out)
    kl = [json.loads(line)["kl_ref"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(kl[-3:]) / 3 < 0.5 * sum(kl[:3]) / 3, kl


# --- on-policy self-distillation (OPSD): privileged context for the teacher only ---

from temper.tasks.base import Problem  # noqa: E402
from temper.train.features.privileged import (  # noqa: E402
    PrivilegedLeak,
    check_no_leak,
    privileged_text,
    teacher_messages,
)


def test_teacher_messages_add_the_solution_for_the_teacher_only():
    task, problem = FirstByteTask(), Problem("first_byte", "train", "p", "q1")
    messages = teacher_messages(task, problem)
    assert messages[-1]["content"] == "q1\n\n" + privileged_text(task, problem)
    assert problem.messages() == [{"role": "user", "content": "q1"}]  # the student's prompt is untouched


def test_the_leak_check_catches_a_planted_leak(tokenizer):
    from temper.data.chat import prompt_ids

    task, problem = FirstByteTask(), Problem("first_byte", "train", "p", "q1")
    secret = privileged_text(task, problem)
    clean = prompt_ids(tokenizer, problem.messages())
    check_no_leak(tokenizer, [clean], [secret])  # nothing raised
    leaked = prompt_ids(
        tokenizer, teacher_messages(task, problem)
    )  # the teacher's prompt given to the student
    with pytest.raises(PrivilegedLeak, match="row 1"):
        check_no_leak(tokenizer, [clean, leaked], [secret, secret])
    ids_only = clean[:-1] + tokenizer.encode(secret, add_special_tokens=False) + clean[-1:]
    with pytest.raises(PrivilegedLeak, match="row 0"):
        check_no_leak(tokenizer, [ids_only], [secret])


class LeakyTask(FirstByteTask):
    """A task whose prompt already holds its own privileged text: the student would see it."""

    def sample(self, split, n, seed):
        return [
            Problem(
                self.name,
                split,
                f"{seed}-{i}",
                f"q\n\n{privileged_text(self, Problem(self.name, split, '', ''))}",
            )
            for i in range(n)
        ]


def test_a_run_whose_student_would_see_the_solution_is_stopped(tmp_path, tokenizer):
    from temper.train.rl import train_rl

    model = build_preset("nano", tokenizer, seed=1)
    config = RLConfig(
        steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False,
        advantage="on_policy_distill", kl_coef=1.0, kl_mode="reward", teacher_context="solution",
    )  # fmt: skip
    with pytest.raises(PrivilegedLeak):
        train_rl(model, tokenizer, [LeakyTask()], config, tmp_path, reference=model)


def test_the_self_teacher_reads_the_privileged_prompt(tmp_path, tokenizer):
    """With teacher: self the reference is the live policy, so every k1 would be 0 if the teacher read
    the student's prompt; with the solution in its prompt the two differ from the first step."""
    save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "student")
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    out = tmp_path / "out"
    out.mkdir()
    run_rl(_stage("self", steps=2, teacher_context="solution"), ctx, tmp_path / "student", out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert abs(rows[0]["kl_ref"]) > 1e-4, rows[0]


def test_self_teacher_needs_privileged_context(tmp_path):
    with pytest.raises(RecipeError, match="teacher 'self' is the policy itself"):
        _recipe(tmp_path, teacher="    teacher: self\n")


def test_a_judge_named_by_stage_is_read_like_a_teacher(tmp_path):
    """rl's `uses` lists a judge named by an earlier stage (checked by the recipe, covered by the
    hash) and leaves out `policy` and an endpoint's model name."""
    from temper.rewards.judge import JudgeSpec
    from temper.stages.rl import _uses

    def stage(judge):
        return RLStage(
            kind="rl", tasks=["t"], train=RLConfig(rewards={"judge": 1.0}, judge=JudgeSpec(**judge))
        )

    assert _uses(stage({"model": "sft"})) == [(("train", "judge", "model"), "sft")]
    assert _uses(stage({"model": "policy"})) == []
    assert _uses(stage({"model": "gpt", "url": "http://localhost:1/v1"})) == []
    with pytest.raises(
        RecipeError, match=r"stages\[1\]\.train\.judge\.model: stage 'distill' reads 'nosuch'"
    ):
        parse_recipe(
            RECIPE.format(
                teacher="",
                advantage="grpo",
                kl_coef=0.0,
                kl_mode="loss",
                source="teacher",
            ).replace("kl_mode: loss}", "kl_mode: loss, rewards: {judge: 1.0}, judge: {model: nosuch}}"),
            "opd.yaml",
            base_dir=tmp_path,
        )


# --- OPSD with a frozen teacher: an earlier stage's weights reading the privileged context ---


def test_recipe_accepts_a_named_teacher_with_privileged_context(tmp_path):
    text = RECIPE.format(
        teacher="    teacher: teacher\n",
        advantage="on_policy_distill",
        kl_coef=1.0,
        kl_mode="reward",
        source="teacher",
    ).replace("kl_mode: reward}", "kl_mode: reward, teacher_context: solution}")
    stage = parse_recipe(text, "opsd.yaml", base_dir=tmp_path).stages[1]
    assert (stage.teacher, stage.train.teacher_context) == ("teacher", "solution")


def test_the_frozen_teacher_reads_the_privileged_prompt(tmp_path, tokenizer):
    """The teacher is a frozen copy of the student's starting weights, so at the first step every
    k1 would be exactly 0 if it read the student's prompt; with the solution added they differ."""
    student = build_preset("nano", tokenizer, seed=1)
    save_model(student, tokenizer, tmp_path / "student")
    save_model(student, tokenizer, tmp_path / "teacher")  # the same weights, loaded as a frozen teacher
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    for context in ("none", "solution"):
        out = tmp_path / f"out-{context}"
        out.mkdir()
        stage = _stage("teacher", steps=1, teacher_context=context)
        run_rl(stage, ctx, tmp_path / "student", out)
        first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        if context == "none":
            assert abs(first["kl_ref"]) < 1e-6, first  # the control: same weights, same prompt
        else:
            assert abs(first["kl_ref"]) > 1e-4, first


def test_the_leak_check_stops_a_run_with_a_frozen_teacher(tmp_path, tokenizer):
    """The leak check does not depend on who the teacher is: with a frozen teacher loaded from an
    earlier stage, a student prompt that holds the solution stops the run before any update."""
    save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "student")
    save_model(build_preset("nano", tokenizer, seed=2), tokenizer, tmp_path / "teacher")
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": LeakyTask()}, task_options={}
    )
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PrivilegedLeak, match="row 0"):
        run_rl(_stage("teacher", steps=1, teacher_context="solution"), ctx, tmp_path / "student", out)
    assert not (out / "model").exists()
