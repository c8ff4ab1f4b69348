"""The process reward model: step labels by hand, the loss by hand, save/load, aggregation, a micro run."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

from temper.algorithms.process_reward import IGNORE, step_bce_loss
from temper.data.dataset import Sequence
from temper.rewards.process_reward_model import (
    ProcessRewardModel,
    aggregate,
    process_model_from,
    step_token_ends,
    token_labels,
)
from temper.tasks import GeneralPoints
from temper.tasks.base import Problem
from temper.tasks.steps import check_equation, label_steps, segment

TASK = GeneralPoints()
HAND = Problem("general_points", "train", "1,2,3,4", "", {"values": [1, 2, 3, 4], "target": 24})


def labels_of(completion: str) -> list[tuple[str, int, str]]:
    spans, steps = label_steps(TASK, HAND, completion)
    return [(completion[s.start : s.end], st.label, st.reason) for s, st in zip(spans, steps)]


# --- step segmentation and labels, by hand on the hand 1 2 3 4 -> 24 -----------------------------


def test_a_right_chain_is_good_at_every_step():
    assert labels_of("1*2=2, 2*3=6, 6*4=24\nAnswer: 1*2*3*4") == [
        ("1*2=2", 1, "valid"),
        ("2*3=6", 1, "valid"),
        ("6*4=24", 1, "valid"),
        ("\nAnswer: 1*2*3*4", 1, "correct"),
    ]


def test_first_error_is_bad_and_the_steps_after_it_are_unlabelled():
    # 2*3=7 is wrong arithmetic; 7*4=28 and the answer come after it: no label
    assert labels_of("1*2=2, 2*3=7, 7*4=28\nAnswer: 1*2*3*4") == [
        ("1*2=2", 1, "valid"),
        ("2*3=7", 0, "wrong_result"),
        ("7*4=28", IGNORE, "after_error"),
        ("\nAnswer: 1*2*3*4", IGNORE, "after_error"),
    ]


def test_each_kind_of_bad_step():
    # 5 is no card; after 1*2=2 the table is 2 3 4, so `2*2` needs a second 2 that is not there
    assert labels_of("5*1=5")[0][1:] == (0, "unavailable_operand")
    assert labels_of("1*2=2, 2*2=4")[1][1:] == (0, "unavailable_operand")
    # 4+3=7 leaves 1 2 7, from which 24 cannot be made (sums <= 10, products 14, (7+1)*2 = 16, 7*(2+1) = 21)
    assert labels_of("4+3=7, 7*2=14\nAnswer: 1")[0][1:] == (0, "dead_end")
    assert labels_of("1 times 2 is 2")[0][1:] == (0, "malformed")
    assert labels_of("4/0=0")[0][1:] == (0, "unavailable_operand")


def test_fractions_and_negatives_as_the_solver_writes_them():
    # 1 3 4 6: 6/(1-3/4) = 24 as the solver steps it: 3/4=3/4, 1-(3/4)=1/4, 6/(1/4)=24
    hand = Problem("general_points", "train", "1,3,4,6", "", {"values": [1, 3, 4, 6], "target": 24})
    text = "3/4=3/4, 1-(3/4)=1/4, 6/(1/4)=24\nAnswer: 6/(1-3/4)"
    _, steps = label_steps(TASK, hand, text)
    assert [s.label for s in steps] == [1, 1, 1, 1]
    reason, table = check_equation("3-(4)=-1", [3, 4], 24)
    assert reason == "dead_end" and table == [3, 4]  # valid arithmetic on the table, but -1 alone is not 24


def test_the_outcome_step_is_always_there():
    assert labels_of("Answer: 1*2*3*4") == [("Answer: 1*2*3*4", 1, "correct")]
    assert labels_of("Answer: 1+2+3+4") == [("Answer: 1+2+3+4", 0, "wrong_value")]
    # cut off in the first line: the equations keep their labels, the outcome is an empty step, no_answer
    assert labels_of("1*2=2, 2*3=6") == [("1*2=2", 1, "valid"), ("2*3=6", 1, "valid"), ("", 0, "no_answer")]
    assert labels_of("") == [("", 0, "no_answer")]
    assert [(s.start, s.end, s.outcome) for s in segment(" 1*2=2 ,2*3=6\nA")] == [
        (1, 6, False),
        (8, 13, False),
        (13, 15, True),
    ]


def test_step_token_ends_point_at_each_steps_last_token(tokenizer):
    text = "1*2=2, 2*3=6\nAnswer: 1"
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    ends = step_token_ends(tokenizer, ids, segment(text))
    # byte tokens: "1*2=2" ends at index 4, "2*3=6" at 11; the outcome at the eos, the last token
    assert ends == [4, 11, len(ids) - 1]
    assert tokenizer.decode(ids[4]) == "2" and tokenizer.decode(ids[11]) == "6"
    # no eos, no second line: the last equation ends at the last token, as the outcome does
    cut = tokenizer.encode("1*2=2, 2*3=6", add_special_tokens=False)
    assert step_token_ends(tokenizer, cut, segment("1*2=2, 2*3=6")) == [4, 11, 11]


def test_a_shared_token_gets_the_first_error():
    # equation good, outcome bad (no answer): bad; equation bad, outcome unlabelled: still bad
    assert token_labels([1, 3, 3], [1, 1, 0], 4) == [IGNORE, 1, IGNORE, 0]
    assert token_labels([1, 3, 3], [1, 0, IGNORE], 4) == [IGNORE, 1, IGNORE, 0]
    assert token_labels([0, 2, 3], [1, 1, 1], 4) == [1, IGNORE, 1, 1]
    assert token_labels([0, 2, 2], [0, IGNORE, IGNORE], 3) == [0, IGNORE, IGNORE]


# --- the loss ----------------------------------------------------------------------------------


def test_step_bce_by_hand_with_the_gradient_sign():
    z = torch.tensor([[0.7, 2.0, -1.0]], requires_grad=True)
    y = torch.tensor([[IGNORE, 1, 0]])
    loss = step_bce_loss(z, y)
    # y=1, z=2: log(1 + e^-2) = 0.126928; y=0, z=-1: log(1 + e^-1) = 0.313262; N = 2
    assert loss.item() == pytest.approx((0.126928 + 0.313262) / 2, abs=1e-6)
    loss.backward()
    # dL/dz = (sigma(z) - y) / N: the good step's logit goes up, the bad one's down, the ignored one untouched
    assert z.grad.tolist()[0] == pytest.approx([0.0, (0.880797 - 1) / 2, 0.268941 / 2], abs=1e-6)
    assert z.grad[0, 1] < 0 < z.grad[0, 2]
    # an explicit N divides the sum instead of this batch's count
    assert step_bce_loss(z, y, 4).item() == pytest.approx((0.126928 + 0.313262) / 4, abs=1e-6)


def test_micro_batches_sum_to_the_whole_batch_gradient(tokenizer, nano, tmp_path):
    nano.save_pretrained(tmp_path / "policy")
    model = process_model_from(tmp_path / "policy", tokenizer.pad_token_id)
    ids_B_T = torch.randint(0, 200, (4, 9))
    labels_B_T = torch.full((4, 9), IGNORE)
    labels_B_T[0, 3], labels_B_T[0, 8], labels_B_T[1, 5], labels_B_T[3, 2], labels_B_T[3, 7] = 1, 0, 1, 0, 1
    step_bce_loss(model(ids_B_T).logits[..., 0], labels_B_T).backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    n = int((labels_B_T != IGNORE).sum())
    for rows in ([0], [1, 2], [3]):  # row 2 has no labelled step at all
        step_bce_loss(model(ids_B_T[rows]).logits[..., 0], labels_B_T[rows], n).backward()
    for a, p in zip(whole, model.parameters()):
        torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-7)


# --- the scorer --------------------------------------------------------------------------------


def test_aggregation():
    assert aggregate([0.9, 0.2, 0.5], "min") == 0.2
    assert aggregate([0.9, 0.2, 0.5], "product") == pytest.approx(0.09)
    assert aggregate([], "min") == 0.0
    with pytest.raises(ValueError, match="min"):
        aggregate([0.5], "mean")


def test_save_load_gives_identical_scores(tokenizer, nano, tmp_path):
    from temper.models import save_model

    nano.save_pretrained(tmp_path / "policy")
    model = process_model_from(tmp_path / "policy", tokenizer.pad_token_id)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # a head that says something
    save_model(model, tokenizer, tmp_path / "prm")
    prm = ProcessRewardModel.load(tmp_path / "prm")
    assert type(prm.model).__name__ == "LlamaForTokenClassification" and prm.model.config.num_labels == 1
    prompts = [[260, 104, 105, 258, 261], [260, 50, 258, 261]]
    completions = [[49, 42, 50, 61, 50, 44, 32, 50, 258], [65, 258]]
    positions = [[4, 8], [1]]
    with torch.no_grad():
        direct = [
            [torch.sigmoid(model(torch.tensor([p + c])).logits[0, len(p) + i, 0]).item() for i in pos]
            for p, c, pos in zip(prompts, completions, positions)
        ]
    # batched and right-padded (the second row is shorter) against one row at a time
    got = prm.step_scores(prompts, completions, positions, batch_size=2)
    assert got == [pytest.approx(d, abs=1e-6) for d in direct]
    assert prm.score(prompts, completions, positions, "product") == pytest.approx(
        [math.prod(d) for d in direct], abs=1e-6
    )
    with pytest.raises(FileNotFoundError, match="no process reward model"):
        ProcessRewardModel.load(tmp_path / "nothing")


# --- a micro run: held-out step accuracy rises --------------------------------------------------


def _labelled(tokenizer, problem: Problem, text: str) -> Sequence:
    spans, steps = label_steps(TASK, problem, text)
    prompt = tokenizer.encode(problem.prompt, add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    per_token = token_labels(step_token_ends(tokenizer, ids, spans), [st.label for st in steps], len(ids))
    return Sequence(prompt + ids, [IGNORE] * len(prompt) + per_token, list(range(len(prompt) + len(ids))))


def test_micro_run_raises_held_out_step_accuracy(tokenizer, nano, tmp_path):
    from temper.stages.process_reward_model import _loss, step_metrics
    from temper.train import NextToken
    from temper.train.supervised import TrainConfig, train_supervised

    def items(split: str, n: int, seed: int) -> list[Sequence]:
        rng, out = random.Random(seed), []
        for p in TASK.sample(split, n, seed):
            demo = TASK.demonstration(p)
            # half of them with a first step that uses a card not in the hand: bad there, nothing after
            text = demo if rng.random() < 0.5 else re.sub(r"^\d+", "99", demo)
            out.append(_labelled(tokenizer, p, text))
        return out

    torch.manual_seed(
        0
    )  # the run's shuffles draw from the global generator: never from what earlier tests left
    train, held_out = items("train", 96, 0), items("test", 48, 1)
    assert {lab for s in held_out for lab in s.labels} == {IGNORE, 0, 1}
    nano.save_pretrained(tmp_path / "policy")
    model = process_model_from(tmp_path / "policy", tokenizer.pad_token_id)
    before = step_metrics(model, held_out, tokenizer.pad_token_id)
    config = TrainConfig(max_steps=40, batch_size=16, lr=3e-3, warmup_steps=2, progress=False, log_every=40)
    train_supervised(
        model, train, config, tmp_path / "run", objective=NextToken(tokenizer.pad_token_id, loss_fn=_loss)
    )
    after = step_metrics(model, held_out, tokenizer.pad_token_id)
    assert after["step_bce"] < before["step_bce"]
    assert after["balanced_accuracy"] > before["balanced_accuracy"] + 0.2
    assert after["step_accuracy"] > max(before["step_accuracy"], after["good_share"])


# --- the experiment's best-of-N estimator, and the stage from the CLI ----------------------------


def _experiment():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "experiments" / "prm_vs_orm.py"
    spec = importlib.util.spec_from_file_location("prm_vs_orm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_best_of_n_is_the_exact_expectation_over_subsets():
    best_of_n = _experiment().best_of_n
    scores, correct = [0.9, 0.5, 0.5, 0.1], [False, True, False, True]
    assert best_of_n(scores, correct, 1) == pytest.approx(0.5)
    # the 6 pairs: ab ac ad -> a (wrong); bc -> a tie, 1/2; bd -> b (right); cd -> c (wrong): 1.5 / 6
    assert best_of_n(scores, correct, 2) == pytest.approx(0.25)
    assert best_of_n(scores, correct, 4) == 0.0
    # ranked by the verifier itself: pass@2 = 1 - C(2, 2) / C(4, 2)
    assert best_of_n([float(c) for c in correct], correct, 2) == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        best_of_n(scores, correct, 5)


@pytest.mark.parametrize("labels", ["steps", "outcome"])
def test_stage_runs_from_the_cli_and_saves_a_loadable_prm(tokenizer, nano, tmp_path, labels, capsys):
    import json

    from temper.cli import main

    nano.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    out = tmp_path / "prm"
    args = ["process_reward_model", "--model", str(tmp_path / "policy"), "--out", str(out), "--labels", labels,
            "--data.tasks", "general_points", "--data.prompts_per_task", "3", "--data.eval_prompts", "2",
            "--data.k", "2", "--data.max_new_tokens", "8", "--train.max_steps", "2", "--train.warmup_steps", "0",
            "--train.batch_size", "2", "--train.progress", "false"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "process_reward_model.json").read_text())
    train = summary["generated"]["general_points/train"]
    assert train["completions"] == 6 and summary["steps"] == 2
    # an untrained nano writes no equation: one labelled token per completion either way
    assert train["good_steps"] + train["bad_steps"] == summary["data"]["labelled_steps"] == 6
    assert len(summary["held_out_evals"]) == 2  # before training and at the end
    prm = ProcessRewardModel.load(out / "process_reward_model")
    assert prm.model.config.num_labels == 1
    # arithmetic's one equation has no step verifier: refused, naming the key
    assert main([a if a != "general_points" else "arithmetic" for a in args]) != 0
    assert "'arithmetic' has no step verifier" in capsys.readouterr().err


class _Fixed:
    """A sampler that answers every prompt with the given texts (ids: the bytes, then eos)."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, texts

    def sample(self, prompts, n, **kwargs):
        from temper.rollout.sampler import Sample

        eos = self.tokenizer.eos_token_id
        ids = [self.tokenizer.encode(t, add_special_tokens=False) + [eos] for t in self.texts]
        return [[Sample(p, i, [0.0] * len(i), t, "eos") for i, t in zip(ids, self.texts)] for p in prompts]


def test_step_items_label_steps_or_only_the_outcome(tokenizer):
    from temper.stages.process_reward_model import step_items

    problem = TASK.sample("train", 1, 0)[0]
    right = TASK.demonstration(problem)  # three valid steps and the correct answer
    wrong = right.split("\n")[0] + "\nAnswer: 1+1"  # the same steps, a wrong answer
    sampler = _Fixed(tokenizer, [right, wrong])
    kw = dict(k=2, temperature=1.0, max_new_tokens=64, seed=0, max_len=512)
    items, rows, counts = step_items(sampler, tokenizer, _OneProblem(problem), "train", 1, **kw)
    assert [[lab for lab in s.labels if lab != IGNORE] for s in items] == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert counts["good_steps"] == 7 and counts["bad_steps"] == 1 and counts["accuracy"] == 0.5
    assert rows[1]["steps"][-1] == ["\nAnswer: 1+1", 0, "wrong_cards"]
    # each label on its step's last token: the byte of the result, then the eos for the outcome
    first = items[0]
    shown = [tokenizer.decode([first.input_ids[i]]) for i, lab in enumerate(first.labels) if lab != IGNORE]
    assert shown[:3] == [st.split("=")[1][-1] for st in right.split("\n")[0].split(", ")]
    assert first.labels[-1] == 1 and first.input_ids[-1] == tokenizer.eos_token_id
    out, _, counts = step_items(sampler, tokenizer, _OneProblem(problem), "train", 1, labels="outcome", **kw)
    assert [[(i, lab) for i, lab in enumerate(s.labels) if lab != IGNORE] for s in out] == [
        [(len(out[0].labels) - 1, 1)],
        [(len(out[1].labels) - 1, 0)],
    ]
    # a completion longer than max_len is dropped and counted, never cut
    _, _, counts = step_items(sampler, tokenizer, _OneProblem(problem), "train", 1, **(kw | {"max_len": 40}))
    assert counts["dropped_too_long"] == 2


class _OneProblem:
    """GeneralPoints that always deals `problem` (step_items samples the task itself)."""

    name = "general_points"

    def __init__(self, problem):
        self.problem = problem

    def sample(self, split, n, seed):
        return [self.problem] * n

    def score(self, problem, completion):
        return TASK.score(problem, completion)
