"""The supervised trainer (pre-training, SFT): a loop over optimizer steps, built on Accelerate.

Behaviour comes from what it is given (sequences and a loss), not from subclasses. Batches are a
pure function of (seed, step), so resuming from a checkpoint replays exactly the batches the
uninterrupted run would have seen, and N processes (`torchrun --nproc_per_node N`, see
`temper.distributed`) split the same global batch N ways: each takes a contiguous share of it,
and the loss is normalized by the global token count, so the DDP-averaged gradient equals one
process's gradient at the same global batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from accelerate import Accelerator
from pydantic import Field

from temper import distributed
from temper.algorithms.losses import IGNORE, sft_loss
from temper.data.dataset import Sequence, collate
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import Precision, resolve_precision
from temper.train import overfitting
from temper.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from temper.train.metrics import MetricsLog, Tracker, progress_bar
from temper.train.schedule import lr_at

# Ranges pydantic checks when a recipe or a CLI flag sets a field (`Annotated` metadata is inert
# in plain Python, so tests and benchmarks still construct these directly); cross-field rules are
# in `temper.stages.base.train_rules`.
Beta = Annotated[float, Field(ge=0, lt=1)]

# the most warm-up steps an unset `warmup_steps` resolves to (it was the flat default before)
DEFAULT_WARMUP = 20


@dataclass
class TrainConfig:
    """Optimizer-step-level settings shared by every supervised stage."""

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
    grad_clip: Annotated[float, Field(ge=0)] = 1.0
    """Max global grad norm; 0 disables."""
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
    steps: int
    final_loss: float
    eval_loss: float | None
    tokens: int  # input tokens processed (pads excluded)
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    precision: dict[str, Any] = field(default_factory=dict)  # PrecisionChoice.as_dict()


def batch_indices(step: int, n_examples: int, batch_size: int, seed: int) -> list[int]:
    """Indices of the global batch at `step`: a stream of seeded permutations, one per epoch."""
    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n_examples)
        perm = torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out += perm[offset : offset + batch_size - len(out)].tolist()
    return out


def _count_supervised(batch: list[Sequence]) -> int:
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
            n = _count_supervised(chunk)
            logits = model(**batch, use_cache=False).logits
            sums += torch.tensor(
                [sft_loss(logits, labels, n).item() * n, n], dtype=torch.float64, device=device
            )
    if accelerator is not None and world > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    model.train(was_training)
    return float(sums[0] / sums[1].clamp_min(1))


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


def adamw(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with no weight decay on vectors (norms, biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=config.betas,
    )


def resume_or_start(out_dir: Path, config: TrainConfig, accelerator: Accelerator) -> tuple[MetricsLog, int]:
    """The run's metrics log and the step to start from: the newest checkpoint under
    `out_dir/checkpoints` is loaded and the log cut back to it; without one a stale log is removed."""
    log = MetricsLog(
        out_dir / "metrics.jsonl",
        accelerator.is_main_process,
        trackers=config.trackers,
        config=asdict(config),
    )
    start = 0
    if checkpoints := list_checkpoints(out_dir / "checkpoints"):
        start = load_checkpoint(checkpoints[-1], accelerator)
        log.truncate_after(start)
    elif accelerator.is_main_process and log.path.exists():
        log.path.unlink()
    accelerator.wait_for_everyone()  # nobody reads the checkpoint folder while it changes
    return log, start


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


def train_supervised(
    model: torch.nn.Module,
    train: list[Sequence],
    config: TrainConfig,
    out_dir: str | Path,
    *,
    pad_id: int,
    eval_set: list[Sequence] | None = None,
    loss_fn: Callable[..., torch.Tensor] = sft_loss,
    callbacks: list[Callable[[int, dict[str, Any]], None]] = (),
    accelerator: Accelerator | None = None,
) -> TrainResult:
    """Train `model` in place on `train` for `config.max_steps` steps; resume from the newest
    checkpoint under `out_dir/checkpoints` if there is one. Metrics go to `out_dir/metrics.jsonl`."""
    if not train:
        raise ValueError("no training sequences (every example was empty or dropped)")
    out_dir = Path(out_dir)
    accelerator = accelerator or distributed.make_accelerator()
    world, rank, per_process, micro = process_batches(config, accelerator)

    torch.manual_seed(config.seed)
    optimizer = adamw(model, config)
    model.train()
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    precision = resolve_precision(config.precision, unwrapped, record=out_dir / PRECISION_RECORD)

    ckpt_root = out_dir / "checkpoints"
    log, start = resume_or_start(out_dir, config, accelerator)
    lr_for = lr_schedule(config)

    history: list[dict[str, Any]] = []
    tokens_total, t_start, t_window, tok_window = 0, time.perf_counter(), time.perf_counter(), 0
    loss_value, eval_loss = float("nan"), None
    progress = progress_bar(config.progress and accelerator.is_main_process)
    with progress, precision.applied(unwrapped):
        bar = progress.add_task(out_dir.name or "train", total=config.max_steps, completed=start, info="")
        for step in range(start, config.max_steps):
            global_idx = batch_indices(step, len(train), config.batch_size, config.seed)
            n_tokens = _count_supervised([train[i] for i in global_idx])  # same on every process
            local = [train[i] for i in global_idx[rank * per_process : (rank + 1) * per_process]]
            for group in optimizer.param_groups:
                group["lr"] = lr_for(step)
            loss_sum = torch.zeros((), device=accelerator.device)
            for m in range(0, per_process, micro):
                chunk = local[m : m + micro]
                batch = {k: v.to(accelerator.device) for k, v in collate(chunk, pad_id).items()}
                labels = batch.pop("labels")
                last = m + micro >= per_process
                ctx = accelerator.no_sync(model) if not last else nullcontext()
                with ctx:
                    logits = model(**batch, use_cache=False).logits
                    loss = loss_fn(logits, labels, n_tokens)
                    # DDP averages gradients over processes; each holds sum_local / N_global.
                    accelerator.backward(loss * world)
                loss_sum += loss.detach()
                tokens_total += sum(len(s.input_ids) for s in chunk)
                tok_window += sum(len(s.input_ids) for s in chunk)
            grad_norm = None
            if config.grad_clip > 0:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = accelerator.reduce(loss_sum, reduction="sum").item()
            done = step + 1

            row: dict[str, Any] = {"step": done, "loss": loss_value, "lr": lr_for(step)}
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            is_last = done == config.max_steps
            if eval_set and ((config.eval_every and done % config.eval_every == 0) or is_last):
                eval_loss = evaluate_loss(unwrapped, eval_set, pad_id, micro, accelerator.device, accelerator)
                row["eval_loss"] = eval_loss
            if done % config.log_every == 0 or is_last or "eval_loss" in row:
                now = time.perf_counter()
                row["tokens_per_s"] = tok_window * world / max(now - t_window, 1e-9)
                t_window, tok_window = now, 0
                log.log(row)
                history.append(row)
            progress.update(bar, advance=1, info=f"loss {loss_value:.4f}")
            for cb in callbacks:
                cb(done, row)
            if config.save_every and done % config.save_every == 0:
                save_checkpoint(ckpt_root, done, accelerator)  # every process: its RNG is saved too

    log.close()
    if accelerator.is_main_process:
        overfitting.warn(log.path, out_dir.name)
    seconds = time.perf_counter() - t_start
    return TrainResult(
        config.max_steps, loss_value, eval_loss, tokens_total * world, seconds, history, precision.as_dict()
    )
