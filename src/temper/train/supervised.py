"""The supervised loop: pre-training, SFT, rft rounds, DPO/IPO/KTO, reward models and prompt
distillation, a loop over optimizer steps built on Accelerate.

What it optimizes comes from the `Objective` it is given (`temper.train.objective`: a batch builder
and a loss), not from subclasses. Batches are a pure function of (seed, step), so resuming from a
checkpoint replays exactly the batches the uninterrupted run would have seen, and N processes
(`torchrun --nproc_per_node N`, see `temper.distributed`) split the same global batch N ways: each
takes a contiguous share of it, and the objective normalizes its loss by the global batch, so the
DDP-averaged gradient equals one process's gradient at the same global batch. A resumed run's
result covers the whole run: the totals up to its checkpoint come back from it, the logged rows
from metrics.jsonl.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from temper import distributed
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import Precision, resolve_precision
from temper.train import overfitting
from temper.train.checkpoint import resume, save_checkpoint
from temper.train.metrics import MetricsLog, Tracker, progress_bar
from temper.train.objective import Objective, Stats, stat_means
from temper.train.schedule import lr_at
from temper.train.strategy import MUON_UNDER_FSDP, Strategy, wrap

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from accelerate import Accelerator

    from temper.train.strategy import Trained

# Ranges pydantic checks when a recipe or a CLI flag sets a field (`Annotated` metadata is inert
# in plain Python, so tests and benchmarks still construct these directly); cross-field rules are
# in `temper.stages.base.train_rules`.
Beta = Annotated[float, Field(ge=0, lt=1)]

# the most warm-up steps an unset `warmup_steps` resolves to (it was the flat default before)
DEFAULT_WARMUP = 20


@dataclass
class TrainConfig:
    """Optimizer-step-level settings shared by every supervised stage."""

    HASHED_WHEN_SET: ClassVar[tuple[str, ...]] = ("optimizer", "muon_momentum", "strategy")
    """Fields added after runs were recorded: left out of the stage hash at their defaults."""

    max_steps: Annotated[int, Field(ge=1)] = 500
    """Optimizer steps."""
    epochs: Annotated[float, Field(gt=0)] | None = None
    """Passes over the training data, instead of max_steps (give one of the two): the stage sets
    the steps to ceil(epochs x sequences / batch_size) once the data is tokenized."""
    batch_size: Annotated[int, Field(ge=1)] = 16
    """Sequences per optimizer step, over all processes."""
    micro_batch_size: Annotated[int, Field(ge=0)] = 0
    """Sequences per forward pass; 0 = the whole per-process batch."""
    lr: Annotated[float, Field(gt=0)] = 1e-3
    """Peak learning rate."""
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    """One of cosine, wsd (warmup-stable-decay), constant."""
    warmup_steps: Annotated[int, Field(ge=0)] | None = None
    """Steps of linear warm-up to the peak lr; unset: a tenth of the steps, at most 20 (20 from
    200 steps on, none below 10). A value given must be below the steps."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Final lr as a fraction of the peak."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw | muon: Muon on the 2-D hidden weights, AdamW (betas, no decay on vectors) on the
    embeddings, the head and the vectors; one lr and weight decay for both (`temper.train.optimizers`)."""
    muon_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.95
    """Muon's Nesterov momentum (optimizer muon only)."""
    grad_clip: Annotated[float, Field(ge=0)] = 1.0
    """Max global grad norm; 0 disables."""
    strategy: Strategy = "ddp"
    """ddp | fsdp: how several processes (torchrun) share the model: ddp keeps it whole in each,
    fsdp shards parameters, gradients and optimizer state (torch FSDP2, `temper.train.strategy`);
    the same losses. One process trains the model itself either way."""
    eval_every: Annotated[int, Field(ge=0)] = 0
    """Steps between eval-loss passes; 0 = only at the end."""
    save_every: Annotated[int, Field(ge=0)] = 0
    """Steps between checkpoints; 0 = none."""
    log_every: Annotated[int, Field(ge=1)] = 10
    seed: int = 0
    progress: bool = True
    """Show a rich progress bar on the main process."""
    precision: Precision = "fp32"
    """fp32 | bf16 (autocast over fp32 weights) | auto (bf16 only where it measures faster here)."""
    trackers: list[Tracker] = field(default_factory=list)
    """Experiment trackers that also get the metrics, e.g. [tensorboard]; metrics.jsonl always."""

    def resolved_warmup(self) -> int:
        """The warm-up steps: the given value, or min(DEFAULT_WARMUP, max_steps // 10)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return min(DEFAULT_WARMUP, self.max_steps // 10)


@dataclass
class TrainResult:
    """A run's summary, over the whole run: a resumed run's covers the steps before the resume."""

    steps: int
    final_loss: float
    eval_loss: float | None
    tokens: int  # input tokens processed (pads excluded)
    seconds: float  # of the training steps, those before a resume included
    history: list[dict[str, Any]] = field(default_factory=list)  # the logged rows (main process: all)
    precision: dict[str, Any] = field(default_factory=dict)  # PrecisionChoice.as_dict()
    losses: list[float] = field(default_factory=list)  # every step's loss
    earlier_seconds: float = 0.0  # the part of `seconds` before the resume (0: not resumed)


def batch_indices(step: int, n_examples: int, batch_size: int, seed: int) -> list[int]:
    """Indices of the global batch at `step`: a stream of seeded permutations, one per epoch."""
    import torch

    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n_examples)
        perm = torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out += perm[offset : offset + batch_size - len(out)].tolist()
    return out


def process_batches(config: TrainConfig, accelerator: Accelerator) -> tuple[int, int, int, int]:
    """(world, rank, per-process batch, micro-batch) of a data-parallel run; a batch that does not
    split evenly over the processes or into micro-batches is refused."""
    world, rank = accelerator.num_processes, accelerator.process_index
    if config.batch_size % world:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by {world} processes")
    per_process = config.batch_size // world
    micro = config.micro_batch_size or per_process
    if per_process % micro:
        raise ValueError(f"per-process batch {per_process} is not divisible by micro_batch_size {micro}")
    return world, rank, per_process, micro


def resume_or_start(
    out_dir: Path, config: TrainConfig, accelerator: Accelerator, trained: Trained | None = None
) -> tuple[MetricsLog, int, dict[str, Any]]:
    """The run's metrics log, the step to start from and the run's totals up to it: the newest
    checkpoint under `out_dir/checkpoints` is loaded (into `trained`'s shards as well, under
    fsdp) and the log cut back to it; without one a stale log is removed."""
    log = MetricsLog(
        out_dir / "metrics.jsonl",
        accelerator.is_main_process,
        trackers=config.trackers,
        config=asdict(config),
    )
    start, totals = resume(out_dir / "checkpoints", accelerator, trained)
    if start:
        log.truncate_after(start)
    elif accelerator.is_main_process and log.path.exists():
        log.path.unlink()
    accelerator.wait_for_everyone()  # nobody reads the checkpoint folder while it changes
    return log, start, totals


def lr_schedule(config: TrainConfig) -> Callable[[int], float]:
    """The learning rate at each step (warm-up, then the configured schedule)."""
    return lambda step: lr_at(
        step,
        lr=config.lr,
        max_steps=config.max_steps,
        warmup_steps=config.resolved_warmup(),
        schedule=config.schedule,
        min_lr_ratio=config.min_lr_ratio,
    )


def backward_batch(
    model: torch.nn.Module,
    objective: Objective,
    items: list[Any],
    context: Any,
    micro: int,
    stats: Stats,
    accelerator: Accelerator | None = None,
) -> tuple[torch.Tensor, int]:
    """Accumulate into `.grad` the gradient of this process's share `items` of a step's loss,
    `micro` items per forward (gradients synchronized on the last); return the loss summed over
    the micro-batches and the tokens read. Any split into micro-batches, and of the global batch
    into processes, gives the same summed gradient (the objective normalizes by the global batch)."""
    import torch

    world = accelerator.num_processes if accelerator else 1
    loss_sum, tokens = torch.zeros((), device=accelerator.device if accelerator else "cpu"), 0
    for m in range(0, len(items), micro):
        last = m + micro >= len(items)
        sync = accelerator.no_sync(model) if accelerator and not last else nullcontext()
        with sync:
            loss, n = objective.loss(model, items[m : m + micro], context, stats)
            # DDP averages the gradients over processes; each holds its share of the global sum
            if accelerator is not None:
                accelerator.backward(loss * world)
            else:
                loss.backward()
        loss_sum += loss.detach().to(loss_sum.device)
        tokens += n
    return loss_sum, tokens


def train_supervised(
    model: torch.nn.Module,
    train: list[Any],
    config: TrainConfig,
    out_dir: str | Path,
    *,
    objective: Objective,
    eval_set: list[Any] | None = None,
    callbacks: list[Callable[[int, dict[str, Any]], None]] = (),
    accelerator: Accelerator | None = None,
) -> TrainResult:
    """Train `model` in place on `train` for `config.max_steps` steps of `objective`; resume from
    the newest checkpoint under `out_dir/checkpoints` if there is one. Metrics go to
    `out_dir/metrics.jsonl` (held-out ones, `objective.evaluate`, at `eval_every` and at the end)."""
    import torch

    if not train:
        raise ValueError("no training sequences (every example was empty or dropped)")
    out_dir = Path(out_dir)
    accelerator = accelerator or distributed.make_accelerator()
    world, rank, per_process, micro = process_batches(config, accelerator)

    torch.manual_seed(config.seed)
    from temper.train.optimizers import build_optimizer  # torch, imported where it runs

    if config.strategy == "fsdp" and config.optimizer == "muon":
        raise ValueError(MUON_UNDER_FSDP)
    model.train()
    # `unwrapped` is the plain model (start, context, evaluation read it: no collective runs
    # there); the loss calls `trained.module` (DDP, or an FSDP-sharded copy published into it)
    unwrapped = model
    trained = wrap(model, lambda m: build_optimizer(m, config), accelerator, config.strategy)
    model, optimizer = trained.module, trained.optimizer
    precision = resolve_precision(config.precision, unwrapped, record=out_dir / PRECISION_RECORD)
    with precision.applied(unwrapped):  # from the starting weights (before any resume)
        train, eval_set = objective.start(unwrapped, train, eval_set or [], micro)

    ckpt_root = out_dir / "checkpoints"
    log, start, totals = resume_or_start(out_dir, config, accelerator, trained)
    lr_for = lr_schedule(config)

    history: list[dict[str, Any]] = log.rows()  # the steps before a resume
    losses: list[float] = list(totals.get("losses", []))
    earlier_seconds: float = totals.get("seconds", 0.0)
    tokens_total = totals.get("tokens", 0)  # this process's (resumed: the main process's so far)
    t_start, t_window, tok_window = time.perf_counter(), time.perf_counter(), 0
    progress = progress_bar(config.progress and accelerator.is_main_process)
    with progress, precision.applied(*trained.forward_modules()):
        bar = progress.add_task(out_dir.name or "train", total=config.max_steps, completed=start, info="")
        for step in range(start, config.max_steps):
            global_idx = batch_indices(step, len(train), config.batch_size, config.seed)
            context = objective.context(unwrapped, [train[i] for i in global_idx])
            local = [train[i] for i in global_idx[rank * per_process : (rank + 1) * per_process]]
            for group in optimizer.param_groups:
                group["lr"] = lr_for(step)
            stats: Stats = {}
            loss_sum, n = backward_batch(model, objective, local, context, micro, stats, accelerator)
            tokens_total, tok_window = tokens_total + n, tok_window + n
            grad_norm = None
            if config.grad_clip > 0:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            trained.publish()  # fsdp: the next step's context and evaluation read the plain model
            loss_value = accelerator.reduce(loss_sum, reduction="sum").item()
            losses.append(loss_value)
            done = step + 1

            row: dict[str, Any] = {"step": done, objective.loss_name: loss_value, "lr": lr_for(step)}
            row |= stat_means(stats, accelerator)
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            is_last = done == config.max_steps
            evaluated = bool(eval_set) and bool(
                (config.eval_every and done % config.eval_every == 0) or is_last
            )
            if evaluated:
                row |= objective.evaluate(unwrapped, eval_set, micro, accelerator)
            if done % config.log_every == 0 or is_last or evaluated:
                now = time.perf_counter()
                row["tokens_per_s"] = tok_window * world / max(now - t_window, 1e-9)
                t_window, tok_window = now, 0
                log.log(row)
                history.append(row)
            progress.update(bar, advance=1, info=f"{objective.loss_name} {loss_value:.4f}")
            for cb in callbacks:
                cb(done, row)
            if config.save_every and done % config.save_every == 0:
                seconds = earlier_seconds + time.perf_counter() - t_start
                totals = {"tokens": tokens_total, "seconds": seconds, "losses": losses}
                # every process saves: its RNG state is in the checkpoint too
                save_checkpoint(ckpt_root, done, accelerator, totals=totals, trained=trained)

    log.close()
    if accelerator.is_main_process:
        overfitting.warn(log.path, out_dir.name)
    seconds = time.perf_counter() - t_start
    eval_loss = next((r[objective.eval_name] for r in reversed(history) if objective.eval_name in r), None)
    return TrainResult(
        config.max_steps,
        losses[-1] if losses else float("nan"),
        eval_loss,
        tokens_total * world,
        earlier_seconds + seconds,
        history,
        precision.as_dict(),
        losses,
        earlier_seconds,
    )
