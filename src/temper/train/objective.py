"""What the supervised loop optimizes: an `Objective` (a batch builder and a loss over items), and
next-token cross-entropy, the objective of pre-training, SFT, rft rounds and the process reward model.

`temper.train.supervised.train_supervised` is the one supervised loop (lr schedule, gradient
accumulation, clipping, logging, evaluation, checkpoints, resume); what differs between SFT,
DPO/IPO/KTO, a reward model and prompt distillation is only the objective it is given:
`NextToken` here, `temper.train.preference.Preference` and
`temper.train.prompt_distill.PromptDistill`. An objective is composed from a pure loss of
`temper.algorithms`, never subclassed from another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from temper import distributed
from temper.algorithms.losses import IGNORE, sft_loss
from temper.data.dataset import Sequence, collate

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from accelerate import Accelerator

Stats = dict[str, "tuple[torch.Tensor, torch.Tensor]"]  # name -> (sum, count); the metric is sum / count


class Objective(Protocol):
    """How items become a loss. Per optimizer step the loop calls `context` once with the whole
    global batch, then `loss` on each micro-batch of this process's share; the micro-batch losses
    of every process must add up to the step's loss (normalized by the global batch, never by the
    micro-batch), so micro-batching and data parallelism never change a gradient."""

    loss_name: str
    """The loss's column in metrics.jsonl and on the progress bar."""
    eval_name: str
    """The held-out loss's column (`TrainResult.eval_loss` reads it)."""

    def start(
        self, model: torch.nn.Module, train: list[Any], eval_set: list[Any], batch_size: int
    ) -> tuple[list[Any], list[Any]]:
        """The train and held-out items as `context` and `loss` read them, computed once from the
        starting model before any checkpoint loads (preference: each with its reference logprobs)."""
        ...

    def context(self, model: torch.nn.Module, batch: list[Any]) -> Any:
        """What every micro-batch of a step needs from the whole global `batch` (its normalizer;
        KTO's reference point). `model` is unwrapped: no DDP collective may run here."""
        ...

    def loss(
        self, model: torch.nn.Module, items: list[Any], context: Any, stats: Stats
    ) -> tuple[torch.Tensor, int]:
        """(this micro-batch's part of the step's loss, the tokens its forward read); adds the
        objective's metrics to `stats` (logged as their means over the step)."""
        ...

    def evaluate(
        self, model: torch.nn.Module, items: list[Any], batch_size: int, accelerator: Accelerator
    ) -> dict[str, float]:
        """Held-out metrics for the log row, keys as logged (every process calls this)."""
        ...


def add_stat(stats: Stats, name: str, values: torch.Tensor, where: torch.Tensor | None = None) -> None:
    """Add `values` (where `where`) to the running sum and count of the metric `name`."""
    import torch

    values = values.detach().float()
    where = torch.ones_like(values, dtype=torch.bool) if where is None else where
    s, c = torch.where(where, values, 0.0).sum(), where.sum().float()
    old = stats.get(name)
    stats[name] = (s, c) if old is None else (old[0] + s, old[1] + c)


def stat_means(stats: Stats, accelerator: Accelerator) -> dict[str, float]:
    """Each metric's sum over count, summed over processes (one collective; none without stats)."""
    import torch

    names = sorted(stats)
    if not names:
        return {}
    sums = torch.stack([torch.stack(stats[n]) for n in names]).to(accelerator.device)  # (names, 2)
    if accelerator.num_processes > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    out = {n: float(s / c) for n, (s, c) in zip(names, sums.tolist()) if c > 0}
    if "rewards/chosen" in out and "rewards/rejected" in out and "rewards/margins" not in out:
        out["rewards/margins"] = (
            out["rewards/chosen"] - out["rewards/rejected"]
        )  # KTO: TRL's difference of means
    return out


def count_supervised(batch: list[Sequence]) -> int:
    """The tokens of `batch` that have a label to predict."""
    return sum(sum(label != IGNORE for label in s.labels[1:]) for s in batch)


def evaluate_loss(
    model: torch.nn.Module,
    sequences: list[Sequence],
    pad_id: int,
    batch_size: int,
    device,
    accelerator: Accelerator | None = None,
) -> float:
    """Token-weighted mean loss over `sequences`; with an `accelerator`, each process scores its
    share and the sums are added up. Pass the unwrapped model: no DDP collective may run here."""
    import torch

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = sequences[distributed.share(len(sequences), rank, world)]
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # (loss x tokens, tokens)
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            chunk = mine[i : i + batch_size]
            batch = {k: v.to(device) for k, v in collate(chunk, pad_id).items()}
            labels = batch.pop("labels")
            n = count_supervised(chunk)
            logits = model(**batch, use_cache=False).logits
            sums += torch.tensor(
                [sft_loss(logits, labels, n).item() * n, n], dtype=torch.float64, device=device
            )
    if accelerator is not None and world > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    model.train(was_training)
    return float(sums[0] / sums[1].clamp_min(1))


@dataclass(frozen=True)
class NextToken:
    """Sequences with per-token labels: `loss_fn(logits, labels, n)` summed over a micro-batch's
    labels and divided by n, the supervised tokens of the whole global batch (`sft_loss`; the
    process reward model passes its per-step BCE). Held out: the token-weighted mean of
    `sft_loss` over every process's share, as `eval_loss`."""

    pad_id: int
    loss_fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] = sft_loss
    loss_name = "loss"
    eval_name = "eval_loss"

    def start(self, model, train: list[Sequence], eval_set: list[Sequence], batch_size: int):
        return train, eval_set

    def context(self, model, batch: list[Sequence]) -> int:
        return count_supervised(batch)  # the same on every process

    def loss(self, model, items: list[Sequence], context: int, stats: Stats) -> tuple[torch.Tensor, int]:
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in collate(items, self.pad_id).items()}
        labels = batch.pop("labels")
        logits = model(**batch, use_cache=False).logits
        return self.loss_fn(logits, labels, context), sum(len(s.input_ids) for s in items)

    def evaluate(self, model, items: list[Sequence], batch_size: int, accelerator) -> dict[str, float]:
        return {
            "eval_loss": evaluate_loss(model, items, self.pad_id, batch_size, accelerator.device, accelerator)
        }
