"""The rft stage (STaR / RFT): only verified samples are kept, deduplicated, the shortest when
asked; a micro run on a learnable task raises the accuracy round by round; an interrupted stage
restarts at the round it was in."""

import json
from dataclasses import dataclass

import pytest

from temper.models import build_preset, save_model
from temper.stages import rft
from temper.stages.context import StageContext
from temper.stages.rft import Candidate, RFTStage, keep_correct, run_rft
from temper.tasks.base import Problem, Score
from temper.train.supervised import TrainConfig


@dataclass
class FirstByteTask:
    """Correct when the completion starts with a digit (about 4% of a random model's first tokens,
    so some of 8 samples of most prompts are): learnable from its own correct samples."""

    name: str = "first_byte"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{split}-{seed}-{i}", f"q{(seed + i) % 7}") for i in range(n)]

    def score(self, problem, completion):
        ok = bool(completion) and completion[0].isdigit()
        return Score(float(ok), ok, bool(completion), {"reason": "correct" if ok else "wrong"})

    def demonstration(self, problem):
        return "A"

    def corpus_text(self, problem):
        return problem.prompt


def test_keep_correct_keeps_only_verified_distinct_samples():
    cands = [
        Candidate("12", 3, True),
        Candidate("wrong", 2, False),
        Candidate("1", 2, True),
        Candidate("12", 3, True),  # a duplicate
        Candidate("345", 4, True),
        Candidate("  ", 1, True),  # graded correct but empty: nothing to learn
    ]
    assert [c.text for c in keep_correct(cands)] == ["1", "12", "345"]  # shortest first, once each
    assert [c.text for c in keep_correct(cands, "shortest")] == ["1"]
    assert [c.text for c in keep_correct(cands, max_per_prompt=2)] == ["1", "12"]
    assert keep_correct([Candidate("x", 1, False)] * 3) == []
    # ties in length break by text, the same on every run
    assert [c.text for c in keep_correct([Candidate("b", 1, True), Candidate("a", 1, True)], "shortest")] == [
        "a"
    ]


def test_shortest_and_cap_are_refused_together():
    with pytest.raises(ValueError, match="keeps one per prompt already"):
        RFTStage(kind="rft", tasks=["t"], keep="shortest", max_per_prompt=2)


def _stage(**kw):
    train = TrainConfig(max_steps=8, batch_size=8, lr=1e-2, warmup_steps=1, progress=False)
    base = dict(
        kind="rft",
        tasks=["first_byte"],
        rounds=2,
        prompts=16,
        k=8,
        max_new_tokens=2,
        eval_problems=32,
        train=train,
    )
    return RFTStage(**(base | kw))


@pytest.fixture
def start(tokenizer, tmp_path):
    return save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "start")


def test_accuracy_rises_over_rounds_on_a_learnable_task(start, tmp_path):
    ctx = StageContext(tmp_path, tmp_path, {"first_byte": FirstByteTask()}, {})
    out = tmp_path / "rft"
    out.mkdir()
    run_rft(_stage(), ctx, start, out)
    rounds = json.loads((out / "rft.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[2]["accuracy"] > rounds[0]["accuracy"] + 0.3, rounds
    assert rounds[2]["yield"] >= rounds[1]["yield"]
    for r in rounds[1:]:
        data = [
            json.loads(line)
            for line in (out / f"round-{r['round']:02d}" / "data.jsonl").read_text().splitlines()
        ]
        assert len(data) == r["kept"] == r["data_size"] and data
        assert all(m["messages"][-1]["content"][0].isdigit() for m in data)  # only verified samples
    assert (out / "model" / "config.json").exists()
    assert "round" in rft.rft_table(out)


def test_an_interrupted_stage_restarts_at_its_round(start, tmp_path, monkeypatch):
    ctx = StageContext(tmp_path, tmp_path, {"first_byte": FirstByteTask()}, {})
    out = tmp_path / "rft"
    out.mkdir()
    calls = []
    real = rft.sample_round

    def counting(sampler, tokenizer, tasks, stage, r):
        calls.append(r)
        if r == 2 and calls.count(2) == 1:
            raise KeyboardInterrupt  # killed while sampling round 2
        return real(sampler, tokenizer, tasks, stage, r)

    monkeypatch.setattr(rft, "sample_round", counting)
    with pytest.raises(KeyboardInterrupt):
        run_rft(_stage(), ctx, start, out)
    first = (out / "round-01" / "model" / "model.safetensors").stat().st_mtime_ns
    run_rft(_stage(), ctx, start, out)
    assert calls == [1, 2, 2]  # round 1 was not redone
    assert (out / "round-01" / "model" / "model.safetensors").stat().st_mtime_ns == first
    rounds = json.loads((out / "rft.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]


# CoT distillation: rft with a teacher writing the samples.


def _digit_teacher(tokenizer, path):
    """A nano model fine-tuned to start its answer with a digit (most of the time, not always)."""
    from temper.data.dataset import build_sequences
    from temper.data.formats import Example
    from temper.train import NextToken
    from temper.train.supervised import train_supervised

    model = build_preset("nano", tokenizer, seed=3)
    task = FirstByteTask()
    examples = [
        Example(source="t", line=i, messages=p.messages() + [{"role": "assistant", "content": str(i % 10)}])
        for i, p in enumerate(task.sample("train", 64, 0))
    ]
    sequences, _ = build_sequences(tokenizer, examples, 32)
    config = TrainConfig(max_steps=25, batch_size=8, lr=1e-2, warmup_steps=1, progress=False)
    train_supervised(
        model, sequences, config, path.parent / "teacher-train", objective=NextToken(tokenizer.pad_token_id)
    )
    return save_model(model.eval(), tokenizer, path)


def test_cot_distillation_trains_the_student_on_the_teachers_verified_samples(start, tokenizer, tmp_path):
    teacher = _digit_teacher(tokenizer, tmp_path / "teacher")
    ctx = StageContext(tmp_path, tmp_path, {"first_byte": FirstByteTask()}, {})
    ctx.models["teacher"] = teacher
    out = tmp_path / "cot"
    out.mkdir()
    train = TrainConfig(max_steps=25, batch_size=8, lr=1e-2, warmup_steps=1, progress=False)
    stage = _stage(rounds=1, teacher="teacher", temperature=1.5, train=train)
    run_rft(stage, ctx, start, out)
    summary = json.loads((out / "rft.json").read_text())
    start_acc, taught = summary["rounds"][0], summary["rounds"][1]
    assert summary["teacher"]["name"] == "teacher" and summary["teacher"]["accuracy"] > 0.9
    # the samples are the teacher's: the random student's own yield is a few percent (see above)
    assert taught["yield"] > 0.9, taught
    assert taught["correct_samples"] < taught["samples"], "the teacher should err sometimes at T=1.5"
    data = [json.loads(line) for line in (out / "round-01" / "data.jsonl").read_text().splitlines()]
    assert data and all(m["messages"][-1]["content"][0].isdigit() for m in data)  # only verified
    assert taught["accuracy"] > start_acc["accuracy"] + 0.5, summary["rounds"]
    assert "teacher 'teacher': greedy accuracy" in rft.rft_table(out)
    from temper.report.common import Stage
    from temper.report.rft import rft_section

    assert "from the teacher 'teacher' (CoT distillation" in rft_section(Stage(out, "rft", None), tmp_path)


def test_cot_distillation_refuses_a_teacher_with_another_tokenizer(start, tokenizer, tmp_path):
    from temper.models import build_tokenizer
    from temper.stages.base import StageError

    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    save_model(build_preset("nano", other, seed=2), other, tmp_path / "teacher")
    ctx = StageContext(tmp_path, tmp_path, {"first_byte": FirstByteTask()}, {})
    (tmp_path / "out").mkdir()
    with pytest.raises(
        StageError, match=r"rft: teacher './teacher' .* do not share a tokenizer: vocabularies of"
    ):
        run_rft(_stage(teacher="./teacher"), ctx, start, tmp_path / "out")


def test_the_teacher_is_out_of_the_hash_when_unset_and_covered_when_set(tmp_path):
    from temper.recipe import parse_recipe
    from temper.runner import _stage_hash
    from temper.stages.markers import stage_settings

    assert "teacher" not in stage_settings(_stage())  # runs recorded before the field stay complete
    assert stage_settings(_stage(teacher="t"))["teacher"] == "t"
    (tmp_path / "student").mkdir()
    text = """\
name: cot
model: {path: ./student}
tasks:
  arithmetic: {max_digits: 1}
stages:
  - kind: sft
    name: teacher
    data: {tasks: [arithmetic], problems_per_task: 8}
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
  - kind: rft
    tasks: [arithmetic]
    source: teacher
    teacher: %s
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
"""
    recipe = parse_recipe(text % "teacher", "cot.yaml", base_dir=tmp_path)
    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={}, task_options=recipe.tasks)
    ctx.models["teacher"] = tmp_path / "t"
    ctx.model_hashes["teacher"] = ctx.output_hashes["teacher"] = "aaaa"
    first = _stage_hash(recipe, 1, ctx)
    ctx.output_hashes["teacher"] = "bbbb"  # the teacher retrained: the distilled student reruns
    assert _stage_hash(recipe, 1, ctx) != first
    from temper.recipe import RecipeError

    with pytest.raises(RecipeError, match="stages\\[1\\].teacher"):
        parse_recipe(text % "techer", "cot.yaml", base_dir=tmp_path)
