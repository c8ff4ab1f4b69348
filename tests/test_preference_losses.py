"""Preference losses: hand-computed values, gradient signs, and TRL's DPOTrainer / KTOTrainer
`_compute_loss` on identical tensors (loss, gradient and the logged metrics).

TRL 1.16's sigmoid DPO has no label smoothing any more (its `label_smoothing` now belongs to the
robust and EXO losses), so cDPO is checked against hand-computed values and its fixed point.
"""

import math
import tempfile

import pytest
import torch

from temper.algorithms.preference import dpo_loss, implicit_rewards, ipo_loss, kto_kl, kto_loss
from temper.data.chat import IGNORE
from temper.data.dataset import Sequence
from temper.data.preferences import TokenizedLabelled, TokenizedPair
from temper.models import build_preset
from temper.train.preference import DPO, KTO, KTOItem, reference_logps, sequence_logps

T = torch.tensor


def _sig(x):
    return 1 / (1 + math.exp(-x))


def test_dpo_hand_computed():
    # h = (-1 - -2) - (-3 - -2.5) = 1 + 0.5 = 1.5; beta 0.1 -> -log sigma(0.15)
    loss = dpo_loss(T([-1.0]), T([-3.0]), T([-2.0]), T([-2.5]), beta=0.1)
    assert loss.item() == pytest.approx(-math.log(_sig(0.15)), abs=1e-6)
    # cDPO: -(0.9) log sigma(0.15) - 0.1 log sigma(-0.15)
    smooth = dpo_loss(T([-1.0]), T([-3.0]), T([-2.0]), T([-2.5]), beta=0.1, label_smoothing=0.1)
    assert smooth.item() == pytest.approx(-0.9 * math.log(_sig(0.15)) - 0.1 * math.log(_sig(-0.15)), abs=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(T([0.0]), T([0.0]), T([0.0]), T([0.0]), beta=0.1, label_smoothing=0.5)


def test_dpo_gradient_raises_chosen_lowers_rejected():
    chosen, rejected = T([-4.0], requires_grad=True), T([-3.0], requires_grad=True)
    dpo_loss(chosen, rejected, T([-4.0]), T([-3.0]), beta=0.5).sum().backward()
    # d l / d log pi(y_w) = -beta sigma(-beta h) = -0.5 * 0.5 at h = 0
    assert chosen.grad.item() == pytest.approx(-0.25) and rejected.grad.item() == pytest.approx(0.25)


def test_cdpo_is_minimal_at_its_finite_margin():
    # the smoothed loss's gradient vanishes at beta h = log((1 - eps) / eps), plain DPO's never does
    eps, beta = 0.2, 0.5
    h = math.log((1 - eps) / eps) / beta
    chosen = T([h], requires_grad=True)
    dpo_loss(chosen, T([0.0]), T([0.0]), T([0.0]), beta=beta, label_smoothing=eps).sum().backward()
    assert chosen.grad.item() == pytest.approx(0.0, abs=1e-6)
    chosen.grad = None
    dpo_loss(chosen, T([0.0]), T([0.0]), T([0.0]), beta=beta).sum().backward()
    assert chosen.grad.item() < -0.01


def test_ipo_hand_computed_and_target_margin():
    # per-token log-ratios: chosen (-2 - -4) / 4 = 0.5, rejected (-3 - -3) / 2 = 0; tau 0.5 -> target 1
    loss = ipo_loss(T([-2.0]), T([-3.0]), T([-4.0]), T([-3.0]), T([4]), T([2]), beta=0.5)
    assert loss.item() == pytest.approx((0.5 - 1.0) ** 2)
    chosen = T([-4.0 + 4 * 1.0], requires_grad=True)  # margin exactly 1 / (2 tau): gradient 0
    ipo_loss(chosen, T([-3.0]), T([-4.0]), T([-3.0]), T([4]), T([2]), beta=0.5).sum().backward()
    assert chosen.grad.item() == pytest.approx(0.0)


def test_kto_hand_computed_and_kl():
    kl = kto_kl(T([-1.0, -2.0, -3.0]), T([-1.5, -2.5, -1.0]))  # mean(0.5, 0.5, -2) < 0 -> clamp 0
    assert kl.item() == pytest.approx(0.0)
    assert kto_kl(T([-1.0, -2.0]), T([-1.5, -3.0])).item() == pytest.approx(0.75)
    assert kto_kl(T([0.0], requires_grad=True), T([-1.0])).requires_grad is False
    loss = kto_loss(
        T([-1.0, -2.0]), T([-2.0, -1.0]), T([True, False]), kl=0.25, beta=2.0,
        desirable_weight=1.5, undesirable_weight=0.5,
    )  # fmt: skip
    # desirable r = 1: 1.5 (1 - sigma(2 (1 - 0.25))); undesirable r = -1: 0.5 (1 - sigma(2 (0.25 + 1)))
    assert loss.tolist() == pytest.approx([1.5 * (1 - _sig(1.5)), 0.5 * (1 - _sig(2.5))], abs=1e-6)
    logp = T([-1.0, -2.0], requires_grad=True)
    kto_loss(logp, T([-1.0, -2.0]), T([True, False]), kl=0.0, beta=1.0).sum().backward()
    assert logp.grad[0] < 0 < logp.grad[1]  # descent raises the desirable, lowers the undesirable


def test_implicit_rewards_detached():
    r = implicit_rewards(T([-1.0], requires_grad=True), T([-3.0]), beta=0.1)
    assert r.item() == pytest.approx(0.2) and not r.requires_grad


# ---- TRL on identical tensors ------------------------------------------------------------------


def _seq(prompt: list[int], completion: list[int]) -> Sequence:
    ids = prompt + completion
    return Sequence(ids, [IGNORE] * len(prompt) + completion, list(range(len(ids))))


def _pairs() -> list[TokenizedPair]:
    g = torch.Generator().manual_seed(0)

    def ids(n):
        return torch.randint(5, 60, (n,), generator=g).tolist()

    return [
        TokenizedPair(_seq(p := ids(4), ids(3)), _seq(p, ids(5))),
        TokenizedPair(_seq(p := ids(6), ids(2)), _seq(p, ids(2))),
        TokenizedPair(_seq(p := ids(3), ids(6)), _seq(p, ids(1))),
    ]


def _trl_batch(seqs: list[Sequence], pad_id: int, prefix: str = "") -> dict[str, torch.Tensor]:
    width = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    attention, completion = torch.zeros_like(ids), torch.zeros_like(ids)
    for r, s in enumerate(seqs):  # right padding, as TRL's collators pad
        n = len(s.input_ids)
        ids[r, :n], attention[r, :n] = T(s.input_ids), 1
        completion[r, :n] = T([int(label != IGNORE) for label in s.labels])
    return {
        f"{prefix}input_ids": ids,
        f"{prefix}attention_mask": attention,
        f"{prefix}completion_mask": completion,
    }


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(("loss_type", "beta"), [("sigmoid", 0.3), ("ipo", 0.4)])
def test_dpo_matches_trl(tokenizer, loss_type, beta):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    model = build_preset("nano", tokenizer, seed=1)
    reference = build_preset("nano", tokenizer, seed=2)
    pairs = _pairs()
    refs = reference_logps(reference, DPO().reference_sequences(pairs), tokenizer.pad_token_id, 8)
    args = trl.DPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=3, beta=beta, loss_type=[loss_type],
        precompute_ref_log_probs=True, report_to=[], use_cpu=True, bf16=False, save_strategy="no",
    )  # fmt: skip
    rows = [{"prompt": "q", "chosen": " a", "rejected": " b"}] * 3
    trainer = trl.DPOTrainer(
        model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )  # fmt: skip

    objective = DPO(beta=beta, loss_type=loss_type)
    model.train()
    model.zero_grad(set_to_none=True)
    stats = {}
    logp, tokens = sequence_logps(model, objective.sequences(pairs), tokenizer.pad_token_id)
    ours = objective.loss(pairs, logp, tokens, refs, None, stats).mean()
    ours.backward()
    ours_grads = _grads(model)

    inputs = _trl_batch(objective.sequences(pairs), tokenizer.pad_token_id)
    inputs |= {"ref_chosen_logps": refs[:, 0], "ref_rejected_logps": refs[:, 1]}
    model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    theirs = trainer._compute_loss(model, inputs, return_outputs=False)
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
    for a, p in zip(ours_grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=0, atol=1e-5)
    logged = trainer._metrics["train"]
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ):
        s, c = stats[name]
        assert (s / c).item() == pytest.approx(logged[name][-1], abs=1e-5), name


def test_kto_matches_trl(tokenizer):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    model = build_preset("nano", tokenizer, seed=1)
    reference = build_preset("nano", tokenizer, seed=2)
    labelled = []
    for i, p in enumerate(_pairs()):
        labelled += [TokenizedLabelled(p.chosen, True), TokenizedLabelled(p.rejected, i == 2)]
    # KL sequences as TRL cycles them: prompt i with completion i - 1
    from temper.train.preference import kto_items

    items = kto_items(labelled)
    assert isinstance(items[0], KTOItem)
    refs = reference_logps(reference, KTO().reference_sequences(items), tokenizer.pad_token_id, 8)
    args = trl.KTOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=6, beta=0.3, desirable_weight=1.3,
        undesirable_weight=0.7, precompute_ref_log_probs=True, train_sampling_strategy="sequential",
        report_to=[], use_cpu=True, bf16=False, save_strategy="no",
    )  # fmt: skip
    rows = [{"prompt": "q", "completion": " a", "label": i % 2 == 0} for i in range(6)]
    trainer = trl.KTOTrainer(
        model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )  # fmt: skip

    objective = KTO(beta=0.3, desirable_weight=1.3, undesirable_weight=0.7)
    model.train()
    model.zero_grad(set_to_none=True)
    stats = {}
    z0 = objective.prepare(model, items, refs, tokenizer.pad_token_id)
    assert z0.item() > 0  # the test exercises the KL term (seeded so that it is positive)
    logp, tokens = sequence_logps(model, objective.sequences(items), tokenizer.pad_token_id)
    ours = objective.loss(items, logp, tokens, refs, z0, stats).mean()
    ours.backward()
    ours_grads = _grads(model)

    inputs = _trl_batch(objective.sequences(items), tokenizer.pad_token_id)
    inputs |= _trl_batch([it.kl for it in items], tokenizer.pad_token_id, prefix="KL_")
    inputs |= {
        "label": T([it.completion.desirable for it in items]),
        "ref_logps": refs[:, 0],
        "ref_KL_logps": refs[:, 1],
    }
    model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    theirs = trainer._compute_loss(model, inputs, return_outputs=False)
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
    for a, p in zip(ours_grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=0, atol=1e-5)
    logged = trainer._metrics["train"]
    for name in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "kl"):
        s, c = stats[name]
        assert (s / c).item() == pytest.approx(logged[name][-1], abs=1e-5), name
