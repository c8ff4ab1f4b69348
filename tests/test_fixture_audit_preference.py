"""Preference fixtures where the plausible one-line bugs differ: ties between chosen and rejected
(equal implicit rewards, equal reward-model scores), which count as inaccurate as TRL's trainers
count them (strict `>`), and KTO's
KL sequences, which must pair each prompt with the previous item's completion (never its own:
the reference point would then be the batch's own KL term, not a mismatched estimate)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from temper.data.preferences import Pair, mismatched, tokenize_labelled, unpair
from temper.train.preference import DPO, BradleyTerry, kto_items


def _rows(n=4) -> list[Pair]:
    # chosen and rejected of different lengths
    return [
        Pair("t", i + 1, [{"role": "user", "content": f"{i}+1"}], [{"role": "assistant", "content": f"{i + 1}"}],
             [{"role": "assistant", "content": f"{i + 7}{i} or so"}])
        for i in range(n)
    ]  # fmt: skip


def _mean(stats, name) -> float:
    total, count = stats[name]
    return float(total / count)


def test_a_tie_is_not_an_accurate_pair():
    """Pairs 1 and 3 tie, pair 2 wins, pair 4 loses: accuracy 1/4 (a `>=` gives 3/4)."""
    chosen = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    rejected = torch.tensor([-1.0, -2.5, -3.0, -3.5])
    refs = torch.zeros(4, 2)
    stats = {}
    DPO(beta=0.5).loss([None] * 4, torch.cat([chosen, rejected]), torch.ones(8), refs, None, stats)
    assert _mean(stats, "rewards/accuracies") == 0.25
    stats = {}
    items = [SimpleNamespace(margin=0.0)] * 4
    BradleyTerry().loss(items, torch.cat([chosen, rejected]), torch.ones(8), refs[:, :0], None, stats)
    assert _mean(stats, "accuracy") == 0.25


def test_kto_kl_sequences_pair_each_prompt_with_the_previous_completion(tokenizer):
    labelled = tokenize_labelled(tokenizer, unpair(_rows()), max_len=64)[0]
    items = kto_items(labelled)
    for i, it in enumerate(items):
        assert it.completion is labelled[i]
        assert it.kl == mismatched(labelled[i].sequence, labelled[i - 1].sequence)
        assert it.kl != labelled[i].sequence  # the fixture's neighbours differ
