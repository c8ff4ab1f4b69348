"""The preference trainer reads its sequences packed (no padding between them): the per-sequence
logprobs and the summed gradient over any micro-batch split are those of the padded forward.

The padded forward here is the trainer's former one (right-padded to the longest sequence, labels
shifted by one, summed cross-entropy), kept as the reference the packed one must reproduce."""

import pytest
import torch
import torch.nn.functional as F

from temper.data.chat import IGNORE
from temper.data.dataset import Sequence, collate
from temper.data.preferences import Pair, tokenize_labelled, tokenize_pairs, unpair
from temper.models import build_preset
from temper.train.preference import (
    DPO,
    KTO,
    Preference,
    Referenced,
    kto_items,
    reference_logps,
    sequence_logps,
)
from temper.train.supervised import backward_batch
from tiny_models import perturbed_nano


def padded_logps(model, seqs: list[Sequence], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one right-padded row per sequence, position t predicting label t + 1."""
    batch = collate(seqs, pad_id)
    labels = batch.pop("labels")
    logits_N_T_V = model(**batch, use_cache=False).logits
    targets_N_T = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
    nll = F.cross_entropy(
        logits_N_T_V.flatten(0, 1).to(torch.promote_types(logits_N_T_V.dtype, torch.float32)),
        targets_N_T.flatten(),
        ignore_index=IGNORE,
        reduction="none",
    ).view_as(targets_N_T)
    return -nll.sum(-1), (targets_N_T != IGNORE).sum(-1)


def _rows(n=8) -> list[Pair]:
    """One long prompt among short ones and completions of different lengths, so several
    sequences share a packed row."""
    return [
        Pair("t", i + 1, f"{i}+1=" + "0" * (40 if i == 0 else 0), f"{i + 1}", f"{i + 7}{i}" * (1 + i % 3))
        for i in range(n)
    ]


@pytest.fixture
def pairs(tokenizer):
    return tokenize_pairs(tokenizer, _rows(), max_len=128)[0]


@pytest.fixture
def labelled(tokenizer):
    return kto_items(tokenize_labelled(tokenizer, unpair(_rows()), max_len=128)[0])


def _multi_turn(tokenizer) -> Sequence:
    """Two trained spans with untrained tokens between them (a chat with two assistant turns)."""
    ids = tokenizer("12+3=15 and 4+4=8, so 15+8=23", add_special_tokens=False)["input_ids"]
    labels = [IGNORE] * len(ids)
    for t in (*range(5, 8), *range(14, 16), *range(len(ids) - 2, len(ids))):
        labels[t] = ids[t]
    return Sequence(ids, labels, list(range(len(ids))))


def test_packed_logprobs_are_the_padded_ones(tokenizer, pairs, labelled):
    pad = tokenizer.pad_token_id
    model = perturbed_nano(tokenizer)
    seqs = (
        DPO().sequences(pairs)
        + [s for column in KTO().reference_sequences(labelled) for s in column]
        + [_multi_turn(tokenizer)]
    )
    read = []  # the (rows, width) of every forward
    model.register_forward_pre_hook(lambda m, args, kw: read.append(kw["input_ids"].shape), with_kwargs=True)
    with torch.no_grad():
        logp, tokens = sequence_logps(model, seqs, pad)
        want_logp, want_tokens = padded_logps(model, seqs, pad)
    assert torch.equal(tokens, want_tokens) and (tokens > 0).all()
    # the case under test: the packed forward read several sequences per row, not one row each
    (rows, width), (_, padded_width) = read
    assert rows < len(seqs) / 2 and rows * width < 0.6 * len(seqs) * padded_width
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-5)


def test_a_float64_models_logprobs_and_references_stay_float64(tokenizer, pairs):
    model = perturbed_nano(tokenizer).double()
    seqs = DPO().sequences(pairs)
    with torch.no_grad():
        logp, _ = sequence_logps(model, seqs, tokenizer.pad_token_id)
        want_logp, _ = padded_logps(model, seqs, tokenizer.pad_token_id)
    assert logp.dtype == torch.float64
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-12)
    refs = reference_logps(model, [seqs], tokenizer.pad_token_id, batch_size=2)
    assert refs.dtype == torch.float64
    # batched by 2 rows, not all at once: other matmul blocking, so equal to float64 rounding only
    torch.testing.assert_close(refs[:, 0], logp, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "objective",
    [DPO(beta=0.5), DPO(beta=0.5, loss_type="ipo"), DPO(beta=0.5, label_smoothing=0.2), KTO(beta=0.5)],
)
def test_packed_micro_batches_sum_to_the_padded_gradient(tokenizer, pairs, labelled, objective):
    items = labelled if isinstance(objective, KTO) else pairs
    pad = tokenizer.pad_token_id
    reference = build_preset("nano", tokenizer, seed=3)
    with torch.no_grad():
        refs = torch.stack(
            [padded_logps(reference, column, pad)[0] for column in objective.reference_sequences(items)], 1
        )
    model = perturbed_nano(tokenizer)
    ctx = objective.prepare(model, items, refs, pad)

    # the padded forward over the whole batch
    logp, tokens = padded_logps(model, objective.sequences(items), pad)
    objective.loss(items, logp, tokens, refs, ctx, {}).mean().backward()
    want = [p.grad.clone() for p in model.parameters()]
    assert any(g.abs().sum() > 0 for g in want)

    trained, referenced = Preference(objective, pad), [Referenced(it, r) for it, r in zip(items, refs)]
    context = trained.context(model, referenced)
    for micro in (len(items), 3, 1):
        model.zero_grad(set_to_none=True)
        backward_batch(model, trained, referenced, context, micro, {})
        for p, g in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
