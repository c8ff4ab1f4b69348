"""The preference trainer (DPO, IPO, KTO): a loop over optimizer steps on pairs or labelled completions.

What it optimizes comes from an `Objective` it is given (`DPO`, `KTO`), not from subclasses. The
reference model's logprobs are computed once, before the first step, from the model as it starts
(with a LoRA adapter: with the adapter disabled), so no frozen copy is held in memory; a resumed
run recomputes them from the starting weights before loading its checkpoint. Batches are a pure
function of (seed, step), as in `temper.train.supervised`; each process takes a contiguous share of
the global batch, and every micro-batch adds its per-example losses divided by the global batch
size, so micro-batching and data parallelism never change a gradient.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from temper import distributed
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
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import resolve_precision
from temper.rewards.reward_model import right_pad, sequence_rewards
from temper.train import overfitting
from temper.train.checkpoint import save_checkpoint
from temper.train.metrics import progress_bar
from temper.train.rollouts import pack
from temper.train.supervised import (
    TrainConfig,
    TrainResult,
    adamw,
    batch_indices,
    lr_schedule,
    process_batches,
    resume_or_start,
)

Stats = dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (sum, count); the metric is sum / count


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
    device = next(model.parameters()).device
    prompts, completions_N_T, mask_N_T, targets_N = _as_completions(seqs, pad_id)
    packed = pack(prompts, completions_N_T.to(device), mask_N_T.to(device))
    logits_P_W_V = model(
        input_ids=packed.input_ids_P_W, position_ids=packed.position_ids_P_W, use_cache=False
    ).logits
    logits_M_V = logits_P_W_V.flatten(0, 1)[packed.index_N]
    targets_M = targets_N.to(device)
    logp_M = -F.cross_entropy(logits_M_V.float(), targets_M, reduction="none")
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
    width = max(len(s.input_ids) for s in seqs) - 1
    completions_N_T = torch.full((len(seqs), max(width, 1)), pad_id, dtype=torch.long)
    labels_N_T = torch.full_like(completions_N_T, IGNORE)
    for row, s in enumerate(seqs):
        n = len(s.input_ids) - 1
        completions_N_T[row, :n] = torch.tensor(s.input_ids[1:], dtype=torch.long)
        labels_N_T[row, :n] = torch.tensor(s.labels[1:], dtype=torch.long)
    mask_N_T = labels_N_T != IGNORE
    return [s.input_ids[:1] for s in seqs], completions_N_T, mask_N_T, labels_N_T[mask_N_T]


def _add(stats: Stats, name: str, values: torch.Tensor, where: torch.Tensor | None = None) -> None:
    values = values.detach().float()
    where = torch.ones_like(values, dtype=torch.bool) if where is None else where
    s, c = torch.where(where, values, 0.0).sum(), where.sum().float()
    old = stats.get(name)
    stats[name] = (s, c) if old is None else (old[0] + s, old[1] + c)


class Objective(Protocol):
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
        _add(stats, "rewards/chosen", r_chosen)
        _add(stats, "rewards/rejected", r_rejected)
        _add(stats, "rewards/margins", r_chosen - r_rejected)
        _add(stats, "rewards/accuracies", (r_chosen > r_rejected).float())
        _add(stats, "logps/chosen", chosen)
        _add(stats, "logps/rejected", rejected)
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
        with torch.no_grad():
            kl_logp, _ = sequence_logps(model, [it.kl for it in items], pad_id)
        return kto_kl(kl_logp, refs[:, 1].to(kl_logp.device))

    def loss(self, items, logp, tokens, refs, ctx, stats: Stats) -> torch.Tensor:
        desirable = torch.tensor([it.completion.desirable for it in items], device=logp.device)
        losses = kto_loss(
            logp, refs[:, 0], desirable, ctx, self.beta, self.desirable_weight, self.undesirable_weight
        )
        rewards = implicit_rewards(logp, refs[:, 0], self.beta)
        # named as TRL's KTOTrainer logs them: means over the desirable / undesirable completions
        _add(stats, "rewards/chosen", rewards, desirable)
        _add(stats, "rewards/rejected", rewards, ~desirable)
        _add(stats, "logps/chosen", logp, desirable)
        _add(stats, "logps/rejected", logp, ~desirable)
        _add(stats, "kl", ctx.expand(len(items)))
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
        chosen, rejected = rewards.chunk(2)
        margin = torch.tensor([p.margin for p in items], dtype=chosen.dtype, device=chosen.device)
        losses = bradley_terry_loss(chosen, rejected, margin, self.center_coef)
        # named as TRL's RewardTrainer logs them (accuracy, margin), and DPO's rewards/*
        _add(stats, "accuracy", (chosen > rejected).float())
        _add(stats, "margin", chosen - rejected)
        _add(stats, "rewards/chosen", chosen)
        _add(stats, "rewards/rejected", rejected)
        return losses


def reference_logps(
    model: torch.nn.Module, columns: list[list[Sequence]], pad_id: int, batch_size: int, n: int = 0
) -> torch.Tensor:
    """(N, columns) summed logprobs under the reference: `model` as it is now, with its LoRA
    adapter disabled if it has one (the base it was added to). No columns: (N, 0), no forward."""
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
            out.append(torch.cat(parts).float().cpu())
    model.train(was_training)
    return torch.stack(out, dim=1)


def _means(stats: Stats, accelerator: Accelerator) -> dict[str, float]:
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


def evaluate_objective(
    model: torch.nn.Module,
    objective: Objective,
    items: list[Any],
    refs: torch.Tensor,
    pad_id: int,
    batch_size: int,
) -> dict[str, float]:
    """The objective's loss and metrics over `items` (held out), without gradient, one process."""
    was_training = model.training
    model.eval()
    stats: Stats = {}
    with torch.no_grad():
        ctx = objective.prepare(model, items, refs, pad_id)
        for i in range(0, len(items), batch_size):
            chunk, r = items[i : i + batch_size], refs[i : i + batch_size]
            logp, tokens = objective.forward(model, objective.sequences(chunk), pad_id)
            _add(stats, "loss", objective.loss(chunk, logp, tokens, r.to(logp.device), ctx, stats))
    model.train(was_training)
    return {n: float(s / c) for n, (s, c) in stats.items() if c > 0}


def backward_batch(
    model: torch.nn.Module,
    items: list[Any],
    idx: list[int],
    refs: torch.Tensor,
    objective: Objective,
    ctx: Any,
    micro: int,
    batch_size: int,
    pad_id: int,
    stats: Stats,
    accelerator: Accelerator | None = None,
) -> tuple[torch.Tensor, int]:
    """Accumulate into `.grad` the gradient of sum_i l_i / batch_size over the items `idx` (this
    process's share of a global batch of `batch_size`), `micro` items per forward; return the
    loss summed over the micro-batches and the tokens processed. Any split of `idx` into
    micro-batches, and of the global batch into processes, gives the same summed gradient."""
    world = accelerator.num_processes if accelerator else 1
    loss_sum, tokens = torch.zeros(()), 0
    for m in range(0, len(idx), micro):
        chunk_idx = idx[m : m + micro]
        chunk = [items[i] for i in chunk_idx]
        last = m + micro >= len(idx)
        sync = accelerator.no_sync(model) if accelerator and not last else nullcontext()
        with sync:
            seqs = objective.sequences(chunk)
            logp, n_tokens = objective.forward(model, seqs, pad_id)
            losses = objective.loss(chunk, logp, n_tokens, refs[chunk_idx].to(logp.device), ctx, stats)
            loss = losses.sum() / batch_size
            # DDP averages the gradients over processes; each holds sum_local / batch_size
            if accelerator is not None:
                accelerator.backward(loss * world)
            else:
                loss.backward()
        loss_sum = loss_sum + loss.detach().cpu()
        tokens += sum(len(s.input_ids) for s in seqs)
    return loss_sum, tokens


def train_preference(
    model: torch.nn.Module,
    items: list[Any],
    objective: Objective,
    config: TrainConfig,
    out_dir: str | Path,
    *,
    pad_id: int,
    eval_items: list[Any] | None = None,
    accelerator: Accelerator | None = None,
) -> TrainResult:
    """Train `model` in place on `items` for `config.max_steps` steps; resume from the newest
    checkpoint under `out_dir/checkpoints`. Metrics go to `out_dir/metrics.jsonl` (eval metrics
    as `eval/<name>`, at `eval_every` and at the end)."""
    if not items:
        raise ValueError("no preference items to train on")
    out_dir = Path(out_dir)
    accelerator = accelerator or distributed.make_accelerator()
    world, rank, per_process, micro = process_batches(config, accelerator)

    torch.manual_seed(config.seed)
    optimizer = adamw(model, config)
    model.train()
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    precision = resolve_precision(config.precision, unwrapped, record=Path(out_dir) / PRECISION_RECORD)
    with precision.applied(unwrapped):  # the reference, from the starting weights (before any resume)
        refs = reference_logps(unwrapped, objective.reference_sequences(items), pad_id, micro, len(items))
        eval_refs = (
            reference_logps(
                unwrapped, objective.reference_sequences(eval_items), pad_id, micro, len(eval_items)
            )
            if eval_items
            else None
        )

    ckpt_root = out_dir / "checkpoints"
    log, start = resume_or_start(out_dir, config, accelerator)
    lr_for = lr_schedule(config)

    history: list[dict[str, Any]] = []
    tokens_total, t_start, t_window, tok_window = 0, time.perf_counter(), time.perf_counter(), 0
    loss_value = float("nan")
    progress = progress_bar(config.progress and accelerator.is_main_process)
    with progress, precision.applied(unwrapped):
        bar = progress.add_task(out_dir.name or "train", total=config.max_steps, completed=start, info="")
        for step in range(start, config.max_steps):
            global_idx = batch_indices(step, len(items), config.batch_size, config.seed)
            ctx = objective.prepare(unwrapped, [items[i] for i in global_idx], refs[global_idx], pad_id)
            local = global_idx[rank * per_process : (rank + 1) * per_process]
            for group in optimizer.param_groups:
                group["lr"] = lr_for(step)
            stats: Stats = {}
            loss_sum, n = backward_batch(
                model,
                items,
                local,
                refs,
                objective,
                ctx,
                micro,
                config.batch_size,
                pad_id,
                stats,
                accelerator,
            )
            tokens_total, tok_window = tokens_total + n, tok_window + n
            grad_norm = None
            if config.grad_clip > 0:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = accelerator.reduce(loss_sum.to(accelerator.device), reduction="sum").item()
            done = step + 1
            row: dict[str, Any] = {"step": done, "loss": loss_value, "lr": lr_for(step)} | _means(
                stats, accelerator
            )
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            is_last = done == config.max_steps
            if eval_items and ((config.eval_every and done % config.eval_every == 0) or is_last):
                if accelerator.is_main_process:
                    metrics = evaluate_objective(unwrapped, objective, eval_items, eval_refs, pad_id, micro)
                    row |= {f"eval/{k}": v for k, v in metrics.items()}
                accelerator.wait_for_everyone()
            if done % config.log_every == 0 or is_last or any(k.startswith("eval/") for k in row):
                now = time.perf_counter()
                row["tokens_per_s"] = tok_window * world / max(now - t_window, 1e-9)
                t_window, tok_window = now, 0
                log.log(row)
                history.append(row)
            progress.update(bar, advance=1, info=f"loss {loss_value:.4f}")
            if config.save_every and done % config.save_every == 0:
                save_checkpoint(ckpt_root, done, accelerator)
    log.close()
    if accelerator.is_main_process:
        overfitting.warn(log.path, out_dir.name)
    return TrainResult(
        config.max_steps,
        loss_value,
        history[-1].get("eval/loss") if history else None,
        tokens_total * world,
        time.perf_counter() - t_start,
        history,
        precision.as_dict(),
    )
