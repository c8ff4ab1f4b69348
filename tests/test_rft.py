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
