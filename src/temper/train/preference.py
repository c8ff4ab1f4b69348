"""Preference objectives (DPO, IPO, KTO, and the reward model's Bradley-Terry) for the one
supervised loop, `temper.train.supervised.train_supervised`.

A method (`DPO`, `KTO`, `BradleyTerry`) says how an item's sequences are scored and which pure
loss of `temper.algorithms.preference` they go through; `Preference(method, pad_id)` is the loop's
`Objective` over it. The reference model's logprobs are computed once, before the first step, from
the model as it starts (with a LoRA adapter: with the adapter disabled), so no frozen copy is held
in memory; a resumed run recomputes them from the starting weights before loading its checkpoint.
Every micro-batch adds its per-item losses divided by the global batch size, so micro-batching
and data parallelism never change a gradient.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from temper.algorithms.preference import (
    bradley_terry_loss,
    dpo_loss,
    implicit_rewards,
    ipo_loss,
    kto_kl,
    kto_loss,
)
from temper.data.chat import IGNORE
from temper.data.dataset import Sequence
from temper.data.preferences import TokenizedLabelled, TokenizedPair, mismatched
from temper.rewards.reward_model import right_pad, sequence_rewards
from temper.train.objective import Stats, add_stat
from temper.train.rollouts import pack

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


def sequence_logps(
    model: torch.nn.Module, seqs: list[Sequence], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log p over each sequence's trained tokens, their number), both (N,).

    The sequences are read packed without padding between them (`temper.train.rollouts.pack`, as
    the RL trainer reads rollouts): rows as wide as the longest sequence, each sequence's position
    ids restarting at 0, so the forward costs the real tokens (plus the tails of the rows), not
    N x the longest. The logprobs are those of the padded batch (tests/test_preference_pack.py).
    The logits come from the model's own forward, so any head (soft-capped, scaled, PEFT-wrapped,
    data-parallel) is applied as the model applies it; only the trained positions reach the
    softmax. `pad_id` fills the packed rows' tails, which nothing reads."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    prompts, completions_N_T, mask_N_T, targets_N = _as_completions(seqs, pad_id)
    packed = pack(prompts, completions_N_T.to(device), mask_N_T.to(device))
    logits_P_W_V = model(
        input_ids=packed.input_ids_P_W, position_ids=packed.position_ids_P_W, use_cache=False
    ).logits
    logits_M_V = logits_P_W_V.flatten(0, 1)[packed.index_N]
    targets_M = targets_N.to(device)
    logits_M_V = logits_M_V.to(torch.promote_types(logits_M_V.dtype, torch.float32))  # fp64 stays
    logp_M = -F.cross_entropy(logits_M_V, targets_M, reduction="none")
    n_tokens = mask_N_T.sum(-1).to(device)
    owner_M = torch.repeat_interleave(torch.arange(len(seqs), device=device), n_tokens)
    return logp_M.new_zeros(len(seqs)).index_add(0, owner_M, logp_M), n_tokens


def _as_completions(
    seqs: list[Sequence], pad_id: int
) -> tuple[list[list[int]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences in `pack`'s terms: the first token as the prompt, the rest as the completion
    (N, T) right-padded, the mask of the tokens with a label (N, T), and those labels in the
    row-major order of the mask (the order `pack` indexes them in). Position t predicts label
    t + 1, as in the padded forward; a label on the first token is never predicted."""
    import torch

    width = max(len(s.input_ids) for s in seqs) - 1
    completions_N_T = torch.full((len(seqs), max(width, 1)), pad_id, dtype=torch.long)
    labels_N_T = torch.full_like(completions_N_T, IGNORE)
    for row, s in enumerate(seqs):
        n = len(s.input_ids) - 1
        completions_N_T[row, :n] = torch.tensor(s.input_ids[1:], dtype=torch.long)
        labels_N_T[row, :n] = torch.tensor(s.labels[1:], dtype=torch.long)
    mask_N_T = labels_N_T != IGNORE
    return [s.input_ids[:1] for s in seqs], completions_N_T, mask_N_T, labels_N_T[mask_N_T]


class PreferenceMethod(Protocol):
    """What a preference stage optimizes: the sequences of an item, how the model scores them,
    the loss, its metrics."""

    def forward(
        self, model: torch.nn.Module, seqs: list[Sequence], pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(one value per sequence, its tokens), both (N,): the summed completion logprobs
        (`sequence_logps`) for DPO and KTO, the scalar reward for a reward model."""
        ...

    def reference_sequences(self, items: list[Any]) -> list[list[Sequence]]:
        """Columns of sequences whose reference logprobs each item needs ((N, columns) once
        computed; no columns: no reference model)."""
        ...

    def sequences(self, items: list[Any]) -> list[Sequence]:
        """The sequences the policy scores with gradient for these items."""
        ...

    def prepare(self, model: torch.nn.Module, items: list[Any], refs: torch.Tensor, pad_id: int) -> Any:
        """Whatever the loss needs from the whole global batch (KTO: its reference point)."""
        ...

    def loss(
        self,
        items: list[Any],
        logp: torch.Tensor,
        tokens: torch.Tensor,
        refs: torch.Tensor,
        ctx: Any,
        stats: Stats,
    ) -> torch.Tensor:
        """Per-item losses (len(items),); adds the item metrics to `stats`."""
        ...


@dataclass(frozen=True)
class DPO:
    """Pairs: sigmoid DPO (with cDPO label smoothing) or IPO."""

    beta: float = 0.1
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"
    label_smoothing: float = 0.0

    def forward(self, model, seqs, pad_id):
        return sequence_logps(model, seqs, pad_id)

    def reference_sequences(self, items: list[TokenizedPair]) -> list[list[Sequence]]:
        return [[p.chosen for p in items], [p.rejected for p in items]]

    def sequences(self, items: list[TokenizedPair]) -> list[Sequence]:
        # one forward over chosen then rejected, as TRL concatenates them
        return [p.chosen for p in items] + [p.rejected for p in items]

    def prepare(self, model, items, refs, pad_id) -> None:
        return None

    def loss(self, items, logp, tokens, refs, ctx, stats: Stats) -> torch.Tensor:
        chosen, rejected = logp.chunk(2)
        if self.loss_type == "ipo":
            n_chosen, n_rejected = tokens.chunk(2)
            losses = ipo_loss(chosen, rejected, refs[:, 0], refs[:, 1], n_chosen, n_rejected, self.beta)
        else:
            losses = dpo_loss(chosen, rejected, refs[:, 0], refs[:, 1], self.beta, self.label_smoothing)
        r_chosen = implicit_rewards(chosen, refs[:, 0], self.beta)
        r_rejected = implicit_rewards(rejected, refs[:, 1], self.beta)
        # named as TRL's DPOTrainer logs them
        add_stat(stats, "rewards/chosen", r_chosen)
        add_stat(stats, "rewards/rejected", r_rejected)
        add_stat(stats, "rewards/margins", r_chosen - r_rejected)
        add_stat(stats, "rewards/accuracies", (r_chosen > r_rejected).float())
        add_stat(stats, "logps/chosen", chosen)
        add_stat(stats, "logps/rejected", rejected)
        return losses


@dataclass(frozen=True)
class KTOItem:
    """A labelled completion and the mismatched sequence (its prompt, another item's completion)
    on which the batch's KL reference point is estimated."""

    completion: TokenizedLabelled
    kl: Sequence


def kto_items(items: list[TokenizedLabelled]) -> list[KTOItem]:
    """Each completion with the KL sequence of its prompt and the previous item's completion
    (cycled by one, as TRL builds `KL_completion_ids` over the data set's order)."""
    return [KTOItem(it, mismatched(it.sequence, items[i - 1].sequence)) for i, it in enumerate(items)]


@dataclass(frozen=True)
class KTO:
    """Labelled completions: KTO with its desirable / undesirable weights."""

    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def forward(self, model, seqs, pad_id):
        return sequence_logps(model, seqs, pad_id)

    def reference_sequences(self, items: list[KTOItem]) -> list[list[Sequence]]:
        return [[it.completion.sequence for it in items], [it.kl for it in items]]

    def sequences(self, items: list[KTOItem]) -> list[Sequence]:
        return [it.completion.sequence for it in items]

    def prepare(self, model, items: list[KTOItem], refs: torch.Tensor, pad_id: int) -> torch.Tensor:
        # z0 over the whole global batch (every process computes it, so no collective is needed
        # and every micro-batch of the step uses the same reference point)
        import torch

        with torch.no_grad():
            kl_logp, _ = sequence_logps(model, [it.kl for it in items], pad_id)
        return kto_kl(kl_logp, refs[:, 1].to(kl_logp.device))

    def loss(self, items, logp, tokens, refs, ctx, stats: Stats) -> torch.Tensor:
        import torch

        desirable = torch.tensor([it.completion.desirable for it in items], device=logp.device)
        losses = kto_loss(
            logp, refs[:, 0], desirable, ctx, self.beta, self.desirable_weight, self.undesirable_weight
        )
        rewards = implicit_rewards(logp, refs[:, 0], self.beta)
        # named as TRL's KTOTrainer logs them: means over the desirable / undesirable completions
        add_stat(stats, "rewards/chosen", rewards, desirable)
        add_stat(stats, "rewards/rejected", rewards, ~desirable)
        add_stat(stats, "logps/chosen", logp, desirable)
        add_stat(stats, "logps/rejected", logp, ~desirable)
        add_stat(stats, "kl", ctx.expand(len(items)))
        return losses


def reward_forward(
    model: torch.nn.Module, seqs: list[Sequence], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the reward model's scalar of each sequence, its tokens), both (N,): right-padded and read
    at the last non-pad token, exactly as `temper.rewards.reward_model.RewardModel.score` reads it."""
    device = next(model.parameters()).device
    ids_N_T, mask_N_T = right_pad([s.input_ids for s in seqs], pad_id)
    rewards_N = sequence_rewards(model, ids_N_T.to(device), mask_N_T.to(device))
    return rewards_N, mask_N_T.sum(-1).to(device)


@dataclass(frozen=True)
class BradleyTerry:
    """Pairs, for a reward model (a one-label sequence classifier): the Bradley-Terry loss on its
    scalar rewards of chosen and rejected, each pair's `margin` subtracted. No reference model."""

    center_coef: float = 0.0

    def forward(self, model, seqs, pad_id):
        return reward_forward(model, seqs, pad_id)

    def reference_sequences(self, items: list[TokenizedPair]) -> list[list[Sequence]]:
        return []

    def sequences(self, items: list[TokenizedPair]) -> list[Sequence]:
        return [p.chosen for p in items] + [p.rejected for p in items]

    def prepare(self, model, items, refs, pad_id) -> None:
        return None

    def loss(self, items, rewards, tokens, refs, ctx, stats: Stats) -> torch.Tensor:
        import torch

        chosen, rejected = rewards.chunk(2)
        margin = torch.tensor([p.margin for p in items], dtype=chosen.dtype, device=chosen.device)
        losses = bradley_terry_loss(chosen, rejected, margin, self.center_coef)
        # named as TRL's RewardTrainer logs them (accuracy, margin), and DPO's rewards/*
        add_stat(stats, "accuracy", (chosen > rejected).float())
        add_stat(stats, "margin", chosen - rejected)
        add_stat(stats, "rewards/chosen", chosen)
        add_stat(stats, "rewards/rejected", rejected)
        return losses


def reference_logps(
    model: torch.nn.Module, columns: list[list[Sequence]], pad_id: int, batch_size: int, n: int = 0
) -> torch.Tensor:
    """(N, columns) summed logprobs under the reference: `model` as it is now, with its LoRA
    adapter disabled if it has one (the base it was added to). No columns: (N, 0), no forward."""
    import torch

    if not columns:
        return torch.zeros(n, 0)
    was_training = model.training
    model.eval()
    disable = getattr(model, "disable_adapter", None)
    out = []
    with torch.no_grad(), disable() if disable else nullcontext():
        for column in columns:
            parts = [
                sequence_logps(model, column[i : i + batch_size], pad_id)[0]
                for i in range(0, len(column), batch_size)
            ]
            out.append(torch.cat(parts).cpu())  # at least fp32 (sequence_logps)
    model.train(was_training)
    return torch.stack(out, dim=1)


def evaluate_method(
    model: torch.nn.Module,
    method: PreferenceMethod,
    items: list[Any],
    refs: torch.Tensor,
    pad_id: int,
    batch_size: int,
) -> dict[str, float]:
    """The method's loss and metrics over `items` (held out), without gradient, one process."""
    import torch

    was_training = model.training
    model.eval()
    stats: Stats = {}
    with torch.no_grad():
        ctx = method.prepare(model, items, refs, pad_id)
        for i in range(0, len(items), batch_size):
            chunk, r = items[i : i + batch_size], refs[i : i + batch_size]
            logp, tokens = method.forward(model, method.sequences(chunk), pad_id)
            add_stat(stats, "loss", method.loss(chunk, logp, tokens, r.to(logp.device), ctx, stats))
    model.train(was_training)
    return {n: float(s / c) for n, (s, c) in stats.items() if c > 0}


@dataclass(frozen=True)
class Referenced:
    """An item with its reference logprobs, one per column of the method's `reference_sequences`."""

    item: Any
    refs: torch.Tensor  # (columns,)


def _refs(items: list[Referenced]) -> torch.Tensor:
    import torch

    return torch.stack([it.refs for it in items])  # (N, columns)


@dataclass(frozen=True)
class Preference:
    """The supervised loop's objective for a preference `method`: a micro-batch's per-item losses
    summed and divided by the global batch size; the reference logprobs of every train and
    held-out item computed once, from the starting model, before any checkpoint loads. Held out:
    the method's loss and metrics, scored on the main process, logged as `eval/<name>`."""

    method: PreferenceMethod
    pad_id: int
    loss_name = "loss"
    eval_name = "eval/loss"

    def start(self, model, train: list[Any], eval_set: list[Any], batch_size: int):
        return self._referenced(model, train, batch_size), self._referenced(model, eval_set, batch_size)

    def _referenced(self, model, items: list[Any], batch_size: int) -> list[Referenced]:
        if not items:
            return []
        columns = self.method.reference_sequences(items)
        refs = reference_logps(model, columns, self.pad_id, batch_size, len(items))
        return [Referenced(it, r) for it, r in zip(items, refs, strict=True)]

    def context(self, model, batch: list[Referenced]) -> tuple[Any, int]:
        return self.method.prepare(model, [b.item for b in batch], _refs(batch), self.pad_id), len(batch)

    def loss(self, model, items: list[Referenced], context, stats: Stats) -> tuple[torch.Tensor, int]:
        prepared, batch_size = context
        chunk = [b.item for b in items]
        seqs = self.method.sequences(chunk)
        scores, n_tokens = self.method.forward(model, seqs, self.pad_id)
        losses = self.method.loss(chunk, scores, n_tokens, _refs(items).to(scores.device), prepared, stats)
        return losses.sum() / batch_size, sum(len(s.input_ids) for s in seqs)

    def evaluate(self, model, items: list[Referenced], batch_size: int, accelerator) -> dict[str, float]:
        metrics = {}
        if accelerator.is_main_process:
            found = evaluate_method(
                model, self.method, [b.item for b in items], _refs(items), self.pad_id, batch_size
            )
            metrics = {f"eval/{k}": v for k, v in found.items()}
        accelerator.wait_for_everyone()
        return metrics
