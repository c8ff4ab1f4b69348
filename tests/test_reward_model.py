"""The reward-model stage: the Bradley-Terry loss against hand-computed values, its gradient's
sign and TRL's RewardTrainer; micro-batching never changes the summed gradient; the head starts
on the policy's backbone (LoRA: the head trains in full); the stage runs from the CLI, its held-out
accuracy rises on a learnable preference, its saved model scores as it did in training; the
calibration table and the report section."""

import json
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from temper.algorithms.preference import bradley_terry_loss
from temper.data.formats import DataError
from temper.data.preferences import Pair, parse_preference, tokenize_pairs
from temper.models import build_preset, with_lora
from temper.rewards.reward_model import RewardModel, reward_model_from_policy
from temper.stages.reward_model import calibration
from temper.train.preference import BradleyTerry, Preference, reward_forward
from temper.train.supervised import backward_batch

# ---- the loss ------------------------------------------------------------------------------------


def test_bradley_terry_loss_by_hand_and_its_gradient_sign():
    chosen = torch.tensor([1.0, 0.0, -0.5], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 0.5], requires_grad=True)
    margin = torch.tensor([0.0, 0.5, 0.0])
    loss = bradley_terry_loss(chosen, rejected, margin)
    # -log sigma(d) = log(1 + e^-d) at d = 1, -0.5, -1
    expected = [math.log(1 + math.exp(-1)), math.log(1 + math.exp(0.5)), math.log(1 + math.exp(1))]
    assert loss.tolist() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx([0.313262, 0.974077, 1.313262], abs=1e-6)
    loss.sum().backward()
    # dl/dr_c = -sigma(-d) < 0 (raise the chosen reward), dl/dr_r = +sigma(-d) > 0 (lower the rejected)
    sig = [1 / (1 + math.exp(d)) for d in (1.0, -0.5, -1.0)]
    assert chosen.grad.tolist() == pytest.approx([-s for s in sig], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx(sig, abs=1e-6)
    # a margin makes a separated pair cost more; the centering term adds c (r_c + r_r)^2
    assert bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), 0.5).item() > loss[0].item()
    centred = bradley_terry_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]), 0.0, center_coef=0.1)
    assert centred.tolist() == pytest.approx([expected[0] + 0.1 * 1.0, expected[0] + 0.1 * 9.0], abs=1e-6)


class _Logits(torch.nn.Module):
    """A 'model' whose reward for row i is the given value: TRL's compute_loss reads `.logits`."""

    def __init__(self, rewards_2B):
        super().__init__()
        self.rewards = rewards_2B

    def forward(self, input_ids, attention_mask, use_cache=False, **kw):
        return SimpleNamespace(logits=self.rewards[: input_ids.shape[0], None])


@pytest.mark.parametrize(
    "margin,center", [(None, None), ([0.3, -0.2, 1.0, 0.0], None), ([0.5, 0.5, 0.0, 2.0], 0.01)]
)
def test_bradley_terry_matches_trl_reward_trainer(margin, center):
    from trl import RewardTrainer

    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(8, generator=g) * 2
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True),
        args=SimpleNamespace(center_rewards_coefficient=center),
        accelerator=SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x),
        _total_train_tokens=0,
        _tp_size=1,
        _metrics={"train": defaultdict(list)},
    )
    inputs = {
        "input_ids": torch.ones(8, 3, dtype=torch.long),
        "attention_mask": torch.ones(8, 3, dtype=torch.long),
    }
    if margin is not None:
        inputs["margin"] = torch.tensor(margin)
    theirs = RewardTrainer.compute_loss(stub, _Logits(rewards), inputs)
    ours = bradley_terry_loss(
        rewards[:4], rewards[4:], torch.tensor(margin) if margin else 0.0, center or 0.0
    ).mean()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert stub._metrics["train"]["accuracy"][0] == pytest.approx(
        (rewards[:4] > rewards[4:]).float().mean().item()
    )


# ---- the objective in the preference trainer --------------------------------------------------------


def _rows(n=8, margins=False) -> list[Pair]:
    """i+1's answer preferred to a wrong one (negative, so the preference is learnable by a nano model)."""
    return [
        Pair("t", i + 1, [{"role": "user", "content": f"{i}+1"}], [{"role": "assistant", "content": f"{i + 1}"}],
             [{"role": "assistant", "content": f"-{i + 7}"}], margin=(0.25 * (i % 3) if margins else None))
        for i in range(n)
    ]  # fmt: skip


def _rm(tokenizer, seed=0):
    return reward_model_from_policy(
        build_preset("nano", tokenizer, seed=seed), tokenizer.pad_token_id, seed=seed
    )


@pytest.mark.parametrize("center", [0.0, 0.05])
def test_micro_batch_split_never_changes_the_gradient(tokenizer, center):
    pairs = tokenize_pairs(tokenizer, _rows(margins=True), max_len=64)[0]
    assert {p.margin for p in pairs} == {0.0, 0.25, 0.5}
    objective, pad = BradleyTerry(center_coef=center), tokenizer.pad_token_id
    model = _rm(tokenizer)
    with torch.no_grad():
        model.score.weight.normal_(generator=torch.Generator().manual_seed(1))  # rewards that differ
    trained = Preference(objective, pad)
    items, _ = trained.start(model, pairs, [], 4)  # no reference columns: no forward
    context = trained.context(model, items)
    grads, losses = [], []
    for micro in (len(pairs), 3, 1):
        model.zero_grad(set_to_none=True)
        loss, _ = backward_batch(model, trained, items, context, micro, {})
        grads.append([p.grad.clone() for p in model.parameters()])
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], abs=1e-6) and losses[2] == pytest.approx(losses[0], abs=1e-6)
    assert (
        model.score.weight.grad.abs().sum() > 0
        and model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    )
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):  # float error: ~1e-6 of the largest entry
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * a.abs().max().item())
    # ... and it is the gradient of the mean Bradley-Terry loss, margins included, over the batch
    model.zero_grad(set_to_none=True)
    r, _ = reward_forward(model, objective.sequences(pairs), pad)
    margin = torch.tensor([p.margin for p in pairs])
    bradley_terry_loss(r[: len(pairs)], r[len(pairs) :], margin, center).mean().backward()
    for a, p in zip(grads[0], model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-5 * a.abs().max().item())


def test_the_head_starts_on_the_policy_backbone(tokenizer):
    policy = build_preset("nano", tokenizer, seed=4)
    rm = reward_model_from_policy(policy, tokenizer.pad_token_id, seed=0)
    assert type(rm).__name__ == "LlamaForSequenceClassification" and rm.config.num_labels == 1
    assert rm.config.pad_token_id == tokenizer.pad_token_id
    for (n, a), (m, b) in zip(rm.model.state_dict().items(), policy.model.state_dict().items(), strict=True):
        assert n == m and torch.equal(a, b)
    # the head is seeded: the same seed, the same head
    again = reward_model_from_policy(policy, tokenizer.pad_token_id, seed=0)
    assert torch.equal(rm.score.weight, again.score.weight)


def test_with_lora_the_head_trains_in_full_and_merges(tokenizer, tmp_path):
    rm = with_lora(_rm(tokenizer), {"r": 4, "alpha": 8, "task_type": "SEQ_CLS"})
    trainable = {n for n, p in rm.named_parameters() if p.requires_grad}
    assert any("score" in n and "modules_to_save" in n for n in trainable)  # the whole head
    assert any("lora_A" in n for n in trainable) and not any("embed_tokens" in n for n in trainable)
    with torch.no_grad():  # a trained adapter and head
        for p in rm.parameters():
            if p.requires_grad:
                p.add_(0.2)
    pairs = tokenize_pairs(tokenizer, _rows(4), max_len=64)[0]
    seqs = [p.chosen for p in pairs]
    before, _ = reward_forward(rm.eval(), seqs, tokenizer.pad_token_id)
    merged = rm.merge_and_unload()
    merged.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    loaded = RewardModel.load(tmp_path / "rm", device=torch.device("cpu"))
    prompts = [s.input_ids for s in seqs]
    got = loaded.score(prompts, [[] for _ in prompts])
    assert got == pytest.approx(before.tolist(), abs=1e-4)


def test_margin_is_read_from_trl_rows():
    row = {"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": 1.5}
    assert parse_preference(row, "f.jsonl", 3).margin == 1.5
    assert parse_preference(row | {"margin": 2}, "f.jsonl", 3).margin == 2.0
    assert parse_preference({k: v for k, v in row.items() if k != "margin"}, "f.jsonl", 3).margin is None
    for bad in ("big", True, float("nan")):
        with pytest.raises(DataError, match=r"f.jsonl:3: field 'margin': must be a finite number"):
            parse_preference(row | {"margin": bad}, "f.jsonl", 3)


def test_calibration_bins_by_confidence():
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    rows = [
        {"chosen": logit(0.95), "rejected": 0.0},  # confident, right
        {"chosen": 0.0, "rejected": logit(0.95)},  # confident (0.95 for rejected), wrong
        {"chosen": logit(0.92), "rejected": 0.0},  # confident, right
        {"chosen": logit(0.55), "rejected": 0.0},  # unsure, right
    ]
    cal = calibration(rows)
    top, low = cal["bins"][-1], cal["bins"][0]
    assert (top["n"], low["n"], cal["pairs"]) == (3, 1, 4)
    assert top["confidence"] == pytest.approx((0.95 + 0.95 + 0.92) / 3) and top["accuracy"] == pytest.approx(
        2 / 3
    )
    assert low["confidence"] == pytest.approx(0.55) and low["accuracy"] == 1.0
    ece = (3 * abs(2 / 3 - (0.95 + 0.95 + 0.92) / 3) + 1 * abs(1 - 0.55)) / 4
    assert cal["ece"] == pytest.approx(ece)


# ---- the stage ----------------------------------------------------------------------------------


def _arithmetic(n: int) -> list[Pair]:
    """a+b with the correct sum preferred to one of four kinds of wrong answers (negated, times ten,
    off by one, with a stray '!'): learnable in a few dozen steps by a nano model, and the untrained
    head prefers some kinds' wrong answer and not others' (measured: 75% held-out accuracy)."""
    out = []
    for i in range(n):
        a, b = (i * 7) % 50, (i * 13) % 40
        c = a + b
        wrong = [f"-{c}", f"{c}0", f"{c + 1}", f"{c}!"][i % 4]
        out.append(Pair("t", i + 1, [{"role": "user", "content": f"{a}+{b}"}],
                        [{"role": "assistant", "content": f"{c}"}], [{"role": "assistant", "content": wrong}]))  # fmt: skip
    return out


def _write(path, rows):
    path.write_text(
        "".join(
            json.dumps({"prompt": r.prompt, "chosen": r.chosen, "rejected": r.rejected}
                       | ({"margin": r.margin} if r.margin is not None else {})) + "\n"
            for r in rows
        )
    )  # fmt: skip
    return path


@pytest.fixture
def saved(tmp_path, tokenizer):
    model = tmp_path / "model"
    build_preset("nano", tokenizer, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    rows = _arithmetic(72)
    return model, _write(tmp_path / "prefs.jsonl", rows[:56]), _write(tmp_path / "eval.jsonl", rows[56:])


def test_stage_runs_from_the_cli_and_held_out_accuracy_rises(saved, tmp_path, tokenizer):
    from temper.cli import main
    from temper.report import write_report

    model, data, held = saved
    out = tmp_path / "run" / "01-rm"
    args = ["reward_model", "--model", str(model), "--out", str(out), "--data.files", str(data),
            "--data.eval_files", str(held), "--train.max_steps", "40", "--train.warmup_steps", "0",
            "--train.batch_size", "8", "--train.lr", "0.003", "--train.eval_every", "10", "--train.log_every", "5"]  # fmt: skip
    assert main(args) == 0
    s = json.loads((out / "reward_model.json").read_text())
    assert s["steps"] == 40 and s["data"]["rows"] == 56 and s["held_out_pairs"] == 16
    assert s["held_out_accuracy_initial"] <= 0.75 and s["held_out_accuracy"] == 1.0
    assert s["held_out_mean_margin"] > 1.0 and s["calibration"]["pairs"] == 16
    assert "contamination" in s  # its training pairs are screened like dpo's and kto's
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"accuracy", "margin", "eval/accuracy", "eval/margin", "eval/loss"} <= set(rows[-1])
    assert rows[-1]["loss"] < rows[0]["loss"]
    # the saved reward model scores the held-out pairs as the stage did at its end
    rm = RewardModel.load(out / "reward_model", device=torch.device("cpu"))
    pairs = tokenize_pairs(tokenizer, _arithmetic(72)[56:], max_len=256)[0]
    scores = rm.score([p.chosen.input_ids for p in pairs], [[] for _ in pairs])
    recorded = [
        json.loads(line)["chosen"] for line in (out / "heldout_rewards.jsonl").read_text().splitlines()
    ]
    assert scores == pytest.approx(recorded, abs=1e-4)
    # no model for later stages: the stage leaves no out/model
    assert not (out / "model").exists()
    # the report section: curves, calibration plot and table
    page = write_report(tmp_path / "run").read_text()
    assert "01-rm calibration" in page and "01-rm loss and accuracy" in page and "held-out accuracy" in page
    assert (tmp_path / "run" / "plots" / "01-rm-calibration.png").exists()


def test_stage_refuses_unpaired_rows_and_adapter_saves(saved, tmp_path, capsys):
    from temper.cli import main

    model, _, _ = saved
    data = tmp_path / "unpaired.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "completion": "2", "label": True}) + "\n")
    base = ["reward_model", "--model", str(model), "--out", str(tmp_path / "o"), "--train.warmup_steps", "0"]
    assert main(base + ["--data.files", str(data)]) != 0
    assert (
        "unpaired.jsonl:1: field 'label': an unpaired (prompt/completion/label) row: a reward model trains on"
        in capsys.readouterr().err
    )
    assert main(base + ["--data.files", str(data), "--lora.save", "adapter"]) != 0
    assert "must be merged for a reward model" in capsys.readouterr().err


def test_a_lora_stage_saves_a_whole_reward_model(saved, tmp_path, tokenizer):
    from temper.cli import main

    model, data, held = saved
    out = tmp_path / "rm-lora"
    args = ["reward_model", "--model", str(model), "--out", str(out), "--data.files", str(data),
            "--data.eval_files", str(held), "--train.max_steps", "4", "--train.warmup_steps", "0",
            "--train.batch_size", "8", "--train.lr", "0.003", "--lora.r", "4"]  # fmt: skip
    assert main(args) == 0
    config = json.loads((out / "reward_model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1
    assert not (out / "reward_model" / "adapter_config.json").exists()
    rm = RewardModel.load(out / "reward_model", device=torch.device("cpu"))
    pairs = tokenize_pairs(tokenizer, _arithmetic(72)[56:], max_len=256)[0]
    scores = rm.score([p.rejected.input_ids for p in pairs], [[] for _ in pairs])
    recorded = [
        json.loads(line)["rejected"] for line in (out / "heldout_rewards.jsonl").read_text().splitlines()
    ]
    assert scores == pytest.approx(recorded, abs=1e-4)


def test_freeze_backbone_trains_the_head_only(saved, tmp_path, tokenizer, capsys):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from temper.cli import main

    model, data, held = saved
    out = tmp_path / "rm-head"
    args = ["reward_model", "--model", str(model), "--out", str(out), "--data.files", str(data),
            "--data.eval_files", str(held), "--train.max_steps", "6", "--train.warmup_steps", "0",
            "--train.batch_size", "8", "--train.lr", "0.01", "--freeze_backbone", "true"]  # fmt: skip
    assert main(args) == 0
    rm = AutoModelForSequenceClassification.from_pretrained(out / "reward_model")
    policy = AutoModelForCausalLM.from_pretrained(model)
    start = reward_model_from_policy(policy, tokenizer.pad_token_id, seed=0)
    for (n, a), b in zip(rm.model.state_dict().items(), policy.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n  # every backbone weight as the policy left it
    assert not torch.equal(rm.score.weight, start.score.weight)  # the head trained
    assert main(args[:-2] + ["--freeze_backbone", "true", "--lora.r", "4", "--out", str(tmp_path / "x")]) != 0
    assert "nothing for a LoRA adapter to train" in capsys.readouterr().err
