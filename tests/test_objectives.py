"""The objectives of the one supervised loop, where the pure losses get their arguments: every
setting of a stage reaches its method, every field of a method reaches its pure loss (a nonzero
beta, label smoothing, IPO, KTO's weights, a margin, the centering coefficient change the loss
exactly as the pure function says), and the loop's micro-batches and processes add up to the
whole batch's gradient for every objective."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from temper.algorithms.preference import bradley_terry_loss, dpo_loss, ipo_loss, kto_kl, kto_loss
from temper.data.preferences import Pair, tokenize_labelled, tokenize_pairs, unpair
from temper.models import build_preset
from temper.rewards.reward_model import reward_model_from_policy
from temper.train.objective import NextToken
from temper.train.preference import (
    DPO,
    KTO,
    BradleyTerry,
    Preference,
    kto_items,
    reward_forward,
    sequence_logps,
)
from temper.train.prompt_distill import Pair as DistillPair
from temper.train.prompt_distill import PromptDistill, completion_logits
from temper.train.supervised import backward_batch
from tiny_models import perturbed_nano


def _rows(n=6) -> list[Pair]:
    return [
        Pair("t", i + 1, [{"role": "user", "content": f"{i}+1"}], [{"role": "assistant", "content": f"{i + 1}"}],
             [{"role": "assistant", "content": f"{i + 7}{i}"}], margin=0.5 * (i % 3))
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def pairs(tokenizer):
    return tokenize_pairs(tokenizer, _rows(), max_len=64)[0]


@pytest.fixture(scope="module")
def labelled(tokenizer):
    return kto_items(tokenize_labelled(tokenizer, unpair(_rows(4)), max_len=64)[0])


def _expected(method, model, raw, refs, pad) -> torch.Tensor:
    """The pure function of `temper.algorithms.preference` on the whole batch, every argument
    written out here from the method's fields: the mean over items."""
    if isinstance(method, KTO):
        logp, _ = sequence_logps(model, [it.completion.sequence for it in raw], pad)
        kl_logp, _ = sequence_logps(model, [it.kl for it in raw], pad)
        z0 = kto_kl(kl_logp.detach(), refs[:, 1])
        desirable = torch.tensor([it.completion.desirable for it in raw])
        return kto_loss(logp, refs[:, 0], desirable, z0, method.beta, method.desirable_weight,
                        method.undesirable_weight).mean()  # fmt: skip
    if isinstance(method, BradleyTerry):
        rewards, _ = reward_forward(model, [p.chosen for p in raw] + [p.rejected for p in raw], pad)
        margin = torch.tensor([p.margin for p in raw])
        return bradley_terry_loss(*rewards.chunk(2), margin, method.center_coef).mean()
    logp, tokens = sequence_logps(model, [p.chosen for p in raw] + [p.rejected for p in raw], pad)
    (chosen, rejected), (n_c, n_r) = logp.chunk(2), tokens.chunk(2)
    if method.loss_type == "ipo":
        return ipo_loss(chosen, rejected, refs[:, 0], refs[:, 1], n_c, n_r, method.beta).mean()
    return dpo_loss(chosen, rejected, refs[:, 0], refs[:, 1], method.beta, method.label_smoothing).mean()


# (method with every field away from its default, the fields that must each change the loss)
METHODS = [
    (DPO(beta=0.3, label_smoothing=0.2), {"beta": 0.1, "label_smoothing": 0.0}),
    (DPO(beta=0.3, loss_type="ipo"), {"beta": 0.1, "loss_type": "sigmoid"}),
    (KTO(beta=0.3, desirable_weight=1.7, undesirable_weight=0.6),
     {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.0}),
    (BradleyTerry(center_coef=0.05), {"center_coef": 0.0}),
]  # fmt: skip


def _setup(method, tokenizer, pairs, labelled):
    raw = labelled if isinstance(method, KTO) else pairs
    pad = tokenizer.pad_token_id
    if isinstance(method, BradleyTerry):
        model = reward_model_from_policy(build_preset("nano", tokenizer, seed=0), pad, seed=0)
        with torch.no_grad():
            model.score.weight.normal_(generator=torch.Generator().manual_seed(1))  # rewards that differ
        reference = None
    else:
        model, reference = perturbed_nano(tokenizer), build_preset("nano", tokenizer, seed=3)
    return raw, pad, model, reference


@pytest.mark.parametrize(
    "method,defaults", METHODS, ids=lambda x: type(x).__name__ if not isinstance(x, dict) else ""
)
def test_every_field_of_a_method_reaches_its_pure_loss(tokenizer, pairs, labelled, method, defaults):
    raw, pad, model, reference = _setup(method, tokenizer, pairs, labelled)

    def loss(m):
        objective = Preference(m, pad)
        items, _ = objective.start(reference if reference is not None else model, raw, [], 4)
        value, _ = objective.loss(model, items, objective.context(model, items), {})
        refs = torch.stack([it.refs for it in items])
        return value, refs

    got, refs = loss(method)
    torch.testing.assert_close(got, _expected(method, model, raw, refs, pad), rtol=1e-6, atol=1e-7)
    if isinstance(method, BradleyTerry):  # the per-pair margin reaches it too
        unmargined = [replace(p, margin=0.0) for p in raw]
        assert not torch.isclose(
            Preference(method, pad).loss(model, *_ctx(method, pad, model, unmargined))[0], got
        )
    for field, default in defaults.items():
        assert not torch.isclose(loss(replace(method, **{field: default}))[0], got), field


def _ctx(method, pad, model, raw):
    objective = Preference(method, pad)
    items, _ = objective.start(model, raw, [], 4)
    return items, objective.context(model, items), {}


def test_each_stage_setting_reaches_its_method(monkeypatch):
    from temper.stages import dpo, kto

    got = []
    for module in (dpo, kto):
        monkeypatch.setattr(module, "run_preference", lambda *args: got.append(args[-1]))
    data = {"files": ["x.jsonl"]}
    job = SimpleNamespace(ctx=None, source=None, out=None)
    dpo.run(dpo.DPOStage(kind="dpo", data=data, beta=0.3, label_smoothing=0.2), job)
    dpo.run(dpo.DPOStage(kind="dpo", data=data, beta=0.4, loss="ipo"), job)
    kto.run(kto.KTOStage(kind="kto", data=data, beta=0.3, desirable_weight=1.7, undesirable_weight=0.6), job)
    assert got == [
        DPO(beta=0.3, loss_type="sigmoid", label_smoothing=0.2),
        DPO(beta=0.4, loss_type="ipo", label_smoothing=0.0),
        KTO(beta=0.3, desirable_weight=1.7, undesirable_weight=0.6),
    ]


def test_the_reward_model_stage_passes_its_centering_coefficient(tmp_path, tokenizer, monkeypatch):
    import json

    import temper.stages.reward_model as rm
    from temper.cli import main

    model = tmp_path / "model"
    build_preset("nano", tokenizer, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in _rows()]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = []

    class Seen(Exception):
        pass

    def capture(model, items, config, out, *, objective, **kwargs):
        seen.append(objective)
        raise Seen

    monkeypatch.setattr(rm, "train_supervised", capture)
    with pytest.raises(Seen):
        main(["reward_model", "--model", str(model), "--out", str(tmp_path / "rm"), "--data.files",
              str(tmp_path / "d.jsonl"), "--center_rewards_coefficient", "0.05"])  # fmt: skip
    assert seen == [Preference(BradleyTerry(center_coef=0.05), tokenizer.pad_token_id)]


# ---- micro-batches and processes add up to the whole batch, for every objective ------------------


def _distill(tokenizer):
    """Prompt distillation on six teacher samples of different lengths."""
    student, teacher = (
        perturbed_nano(tokenizer),
        build_preset("nano", tokenizer, seed=5).requires_grad_(False),
    )
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    items = [DistillPair(enc(f"rule {i}: q{i}"), enc(f"q{i}"), enc("7" * (1 + i % 3))) for i in range(6)]
    return PromptDistill(teacher, tokenizer.pad_token_id), student, items


def _distill_reference(objective, model, items):
    """The forward KL over every completion token of the batch, in one forward each."""
    from temper.algorithms.distill import forward_kl_loss

    lengths = [len(p.completion) for p in items]
    with torch.no_grad():
        t, mask = completion_logits(objective.teacher, [p.teacher_prompt + p.completion for p in items],
                                    [len(p.teacher_prompt) for p in items], lengths, objective.pad_id)  # fmt: skip
    s, _ = completion_logits(model, [p.student_prompt + p.completion for p in items],
                             [len(p.student_prompt) for p in items], lengths, objective.pad_id)  # fmt: skip
    return forward_kl_loss(s, t, mask)


def _next_token_reference(objective, model, items):
    """`sft_loss` over the whole batch collated at once."""
    from temper.algorithms.losses import sft_loss
    from temper.data.dataset import collate

    batch = collate(items, objective.pad_id)
    labels = batch.pop("labels")
    return sft_loss(model(**batch, use_cache=False).logits, labels)


def _objective(which, tokenizer, pairs, labelled):
    """(objective, model, its items, the whole-batch loss written out or None) for `which`."""
    pad = tokenizer.pad_token_id
    if which == "next_token":
        return NextToken(pad), perturbed_nano(tokenizer), [p.chosen for p in pairs], _next_token_reference
    if which == "prompt_distill":
        objective, student, items = _distill(tokenizer)
        return objective, student, items, _distill_reference
    method = {
        "dpo": DPO(beta=0.3, label_smoothing=0.1),
        "ipo": DPO(beta=0.3, loss_type="ipo"),
        "kto": KTO(beta=0.3, desirable_weight=1.4),
    }[which]
    objective = Preference(method, pad)
    items, _ = objective.start(
        build_preset("nano", tokenizer, seed=3), labelled if which == "kto" else pairs, [], 4
    )
    return objective, perturbed_nano(tokenizer), items, None  # (the reference: test_preference_train.py)


@pytest.mark.parametrize("which", ["next_token", "dpo", "ipo", "kto", "prompt_distill"])
def test_any_split_gives_the_whole_batch_gradient(tokenizer, pairs, labelled, which):
    """Micro-batches of all, 4 and 1, and two 'processes' (halves, each its own backward with
    the global batch's context) accumulate the same gradient: the whole batch's loss's."""
    objective, model, items, reference = _objective(which, tokenizer, pairs, labelled)
    context = objective.context(model, items)
    grads = []
    for shares, micro in (([items], len(items)), ([items], 4), ([items], 1), ([items[:3], items[3:]], 2)):
        model.zero_grad(set_to_none=True)
        for share in shares:
            backward_batch(model, objective, share, context, micro, {})
        grads.append([p.grad.clone() for p in model.parameters()])
    assert sum(g.abs().sum() for g in grads[0]) > 0
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if reference is not None:
        model.zero_grad(set_to_none=True)
        reference(objective, model, items).backward()
        for a, p in zip(grads[0], model.parameters(), strict=True):
            torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-6)


def test_prompt_distillations_held_out_kl_is_the_whole_sets(tokenizer):
    """Scored 4 at a time, the held-out KL per completion token is the whole set's, and the model
    is put back in training mode."""
    objective, student, items = _distill(tokenizer)
    with torch.no_grad():
        whole = _distill_reference(objective, student.eval(), items).item()
    student.train()
    got = objective.evaluate(student, items, 4, None)
    assert got.keys() == {"eval/kl"} and got["eval/kl"] == pytest.approx(whole, rel=1e-6) and student.training
