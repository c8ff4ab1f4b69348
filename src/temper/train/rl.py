"""The RL trainer: draw problems -> run episodes -> grade -> features -> advantages -> update ->
sync -> log -> checkpoint, one step at a time.

One loop serves the GRPO family (group-relative outcome advantages: grpo, dr_grpo, rloo,
reinforce_pp), PPO (a value head and GAE over token rewards), the turn estimators and
distillation. What varies a run beyond the core settings is an RL feature
(`temper.train.features`: dynamic sampling, AdaptThink, OPSD's teacher context, learned rewards,
path rewards, curricula, the reward-hacking monitors), each one module whose hooks run at fixed
points of the loop below. Departures from the textbook loop:
1. The importance ratio is taken against the sampler's logprobs (tests check the sampler matches
   teacher forcing); the sampler/trainer mismatch is measured every step (from the update's first
   forward when it is over every row at the sampling weights, else one no-grad forward in
   `prepare`), and the `rollout_correction` feature can weight the loss by it (then the ratio is
   against the trainer's logprobs at sampling time, verl's decoupled mode).
2. KL to the frozen reference either as a loss term (k3, GRPO) or in the reward (k1, RLHF).
3. Every step logs the zero-variance share by cause, not just the reward.
4. Data parallel (N processes, see `train_rl`): each process samples, grades and trains on its
   share of the step's groups; one process gives the same losses at the same global batch.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from rich.console import Console
from transformers import PreTrainedTokenizerBase

from temper import distributed
from temper.jsonl import iter_jsonl
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import resolve_precision
from temper.rewards import BATCH_COMPONENTS
from temper.rewards.judge import GroupScorer
from temper.rollout import HFSampler, Sampler
from temper.tasks.base import Task
from temper.train import features as rl_features
from temper.train.checkpoint import list_checkpoints, resume, save_checkpoint, step_of
from temper.train.collect import (
    collect_groups,
    episode_limits,
    problems_for_step,
    sample_share,
    sampling_stats,
)
from temper.train.features import RunStart, Step
from temper.train.metrics import MetricsLog, progress_bar
from temper.train.pipeline import Inline, Pipelined, in_flight_metrics
from temper.train.provenance import RunProvenance
from temper.train.rl_config import RLConfig
from temper.train.rl_metrics import episode_metrics, rollout_metrics, update_metrics
from temper.train.rl_update import policy_with_value, prepare, update
from temper.train.rollouts import Group, rollout_record, to_batch
from temper.train.schedule import lr_at
from temper.train.strategy import wrap

__all__ = [
    "RLConfig",
    "RLResult",
    "collect_groups",
    "episode_metrics",
    "problems_for_step",
    "rollout_metrics",
    "sample_share",
    "train_rl",
]

console = Console(stderr=True)


@dataclass
class RLResult:
    steps: int
    history: list[dict[str, Any]]
    seconds: float
    sampled_tokens: int
    trained_tokens: int
    precision: dict[str, Any] = field(default_factory=dict)  # PrecisionChoice.as_dict() of the update


def require(
    config: RLConfig, reference: torch.nn.Module | None, scorers: dict[str, GroupScorer], world: int
) -> None:
    """What `train_rl` needs of its arguments. The settings' own rules are the recipe's
    (`rl_config.rl_rules`, checked when a recipe is validated), not checked again here."""
    if config.kl_coef > 0 and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    if missing := [n for n in config.rewards if n in BATCH_COMPONENTS and n not in scorers]:
        raise ValueError(f"reward component {missing[0]!r} needs a scorer: {BATCH_COMPONENTS[missing[0]]}")
    if config.prompts_per_step % world:
        raise ValueError(f"prompts_per_step {config.prompts_per_step} is not divisible by {world} processes")


def _resume_point(
    out_dir: Path, main: bool, log: MetricsLog, rollouts: MetricsLog
) -> tuple[int, list[dict[str, Any]]]:
    """(the step the run resumes from, the newest checkpoint's; the metrics rows logged before
    it), read before the checkpoint is loaded. The logs are cut back to that step (replayed
    steps are logged again); a fresh run's are removed."""
    checkpoints = list_checkpoints(out_dir / "checkpoints")
    if not checkpoints:
        if main:
            for path in (log.path, rollouts.path):
                path.unlink(missing_ok=True)
        return 0, []
    start = step_of(checkpoints[-1])
    log.truncate_after(start)
    rollouts.truncate_after(start)
    return start, [r for _, _, r in iter_jsonl(log.path) if isinstance(r, dict)] if log.path.exists() else []


def _eval_due(config: RLConfig, step: int) -> bool:
    """Every `eval_every` steps (1-based `step`) and at the last."""
    return bool(config.eval_every) and (step % config.eval_every == 0 or step == config.steps)


PIPELINE_FILE = "pipeline.pt"
"""A pipelined run's checkpoint file: the weights of the last k versions, which the batches in
flight at the checkpoint were (or will be) sampled with."""


def _pipeline(
    config: RLConfig, out_dir: Path, start: int, model: torch.nn.Module, sampler: Sampler,
    train_sampler: Sampler, features: rl_features.Features, tokenizer: PreTrainedTokenizerBase, tasks: list[Task], rank: int,
    world: int, scorers: dict[str, GroupScorer],
) -> Inline | Pipelined:  # fmt: skip
    """The run's source of batches (`temper.train.pipeline`): inline for max_staleness 0, else a
    worker started from the resumed step with the kept weights of the newest checkpoint."""

    def sample_step(with_sampler: Sampler, step: int, graded: list[Group]) -> tuple:
        return sample_share(
            with_sampler, tokenizer, tasks, config, step, rank, world, graded, scorers, features
        )

    block = config.async_rollouts
    if not block.max_staleness:
        return Inline(sample_step, train_sampler)
    if not isinstance(sampler, HFSampler) and block.worker != "thread":
        raise ValueError(
            f"async_rollouts.max_staleness {block.max_staleness} with {type(sampler).__name__} needs worker: "
            "thread (the worker drives the engine, which a forked process cannot share)"
        )
    checkpoints = list_checkpoints(out_dir / "checkpoints")
    kept = checkpoints[-1] / PIPELINE_FILE if checkpoints else None
    versions = torch.load(kept, weights_only=True) if kept is not None and kept.exists() else {}
    return Pipelined(
        block.max_staleness, sample_step, model, sampler, start=start, last=config.steps - 1,
        versions=versions, worker=block.worker, wrap=features.sampler, in_flight=block.in_flight,
    )  # fmt: skip


@contextlib.contextmanager
def pipeline_closed(pipeline: Inline | Pipelined):
    try:
        yield pipeline
    finally:
        pipeline.close()


def train_rl(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    out_dir: str | Path,
    *,
    sampler: Sampler | None = None,
    reference: torch.nn.Module | None = None,
    evaluate: Callable[[int], dict[str, float]] | None = None,
    callbacks: list[Callable[[int, dict[str, Any]], None]] = (),
    accelerator: Accelerator | None = None,
    scorers: dict[str, GroupScorer] | None = None,
) -> RLResult:
    """Train `model` in place. `reference` is the frozen model for the KL term (required when
    kl_coef > 0). `scorers` give the batch reward components `config.rewards` names, by name (a
    learned reward model as "reward_model", a judge as "judge"; required for each of them): each
    scores a sampling round's episodes together before grading. Resumes from the newest checkpoint
    under `out_dir/checkpoints`.

    Under N processes (see temper.distributed) each samples, grades and prepares its share of the
    step's groups (`sample_share`); `prepare` sums the batch-wide advantage statistics (GAE
    whitening, reinforce_pp) over processes and `update` every loss normalizer, and DDP averages
    the gradients (`config.strategy`: DDP, or FSDP2 over sharded parameters, see
    `temper.train.strategy`), so the losses equal one process's at the same global batch (GRPO in
    tests/test_distributed.py; gae, reinforce_pp, rloo and a KL term checked by hand). The logged
    metrics describe the global batch (the groups are gathered), `evaluate` runs on the main
    process while the others wait, and only the main process writes metrics.jsonl, rollouts.jsonl
    and the checkpoints' shared files. Every process keeps its own sampler. With dynamic sampling
    each process refills its own share, and if their kept counts differ all train on the smallest
    (DDP needs the same collectives in every process)."""
    out_dir = Path(out_dir)
    accelerator = accelerator or distributed.make_accelerator()
    rank, world, main = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
    scorers = scorers or {}
    require(config, reference, scorers, world)
    sampler = sampler or HFSampler(
        model,
        tokenizer,
        precision=resolve_precision(
            config.precision, model, "sample", record=Path(out_dir) / PRECISION_RECORD
        ),
    )

    def adamw(module: torch.nn.Module) -> torch.optim.Optimizer:
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.99))

    # the strategy wraps the one module the update differentiates (the policy and, for PPO, its
    # value head): DDP over the bare model's own tensors, or FSDP over a sharded copy published
    # into the bare model after each update; the sampler keeps the bare model, so sampling and
    # evaluation run no collective
    trained = wrap(policy_with_value(model, config), adamw, accelerator, config.strategy)
    trainable, optimizer = trained.module, trained.optimizer
    # the LMs whose forward precision patches: the bare one and, under fsdp, the trained copy's
    policies = list({id(m): m for m in (model, trained.inner.policy)}.values())
    # after the accelerator: rank 0 decides (a resumed run keeps its recorded choice)
    precision = resolve_precision(config.precision, model, record=Path(out_dir) / PRECISION_RECORD)
    log = MetricsLog(out_dir / "metrics.jsonl", main, trackers=config.trackers, config=asdict(config))
    rollouts = MetricsLog(out_dir / "rollouts.jsonl", enabled=main)
    start, past = _resume_point(out_dir, main, log, rollouts)
    # the features start from the starting weights (AdaptThink's reference accuracy), then a
    # resumed run's checkpoint is loaded
    features = rl_features.start(config, RunStart(
        model, tokenizer, tasks, sampler, out_dir, main, start, past,
        lambda step: problems_for_step(tasks, config.prompts_per_step, config.seed, step), episode_limits(config),
    ))  # fmt: skip
    train_sampler = features.sampler(sampler)
    origin = RunProvenance.of_run(train_sampler, tokenizer, tasks, config, base=sampler)  # once per run
    loaded, totals = resume(out_dir / "checkpoints", accelerator, trained)
    assert loaded == start, (loaded, start)
    accelerator.wait_for_everyone()
    # where each step's batch comes from: sampled when the step asks, or by a worker k steps ahead
    # (started before the progress bar's thread: a process worker forks)
    pipeline = _pipeline(
        config,
        out_dir,
        start,
        model,
        sampler,
        train_sampler,
        features,
        tokenizer,
        tasks,
        rank,
        world,
        scorers,
    )

    # a resumed run's result is the whole run's: its rows and totals before the resume come back
    history: list[dict[str, Any]] = list(past)
    sampled_tokens, trained_tokens = totals.get("sampled_tokens", 0), totals.get("trained_tokens", 0)
    t_start = time.perf_counter() - totals.get("seconds", 0.0)
    progress = progress_bar(config.progress and main)
    with pipeline_closed(pipeline), contextlib.closing(features), progress:
        bar = progress.add_task(out_dir.name or "rl", total=config.steps, completed=start, info="")
        for step in range(start, config.steps):
            # 1. draw problems, run episodes, grade: this process's share; the metrics describe the
            # gathered global batch
            t0 = time.perf_counter()
            model.eval()
            drawn = pipeline.take(step, model)
            local, causes, rounds, failed, graded = (
                drawn.local,
                drawn.causes,
                drawn.rounds,
                drawn.failed,
                drawn.graded,
            )
            if world > 1:  # equal shares: every process must run the same collectives below
                local = local[: min(distributed.gather([len(local)]))]
                causes, rounds = distributed.gather(causes), max(distributed.gather([rounds]))
                failed = distributed.gather(failed)
            groups = distributed.gather(local)
            t1 = time.perf_counter()
            # 2. the features' part of the graded step (the user-code policy, curricula, AdaptThink's modes...)
            now = Step(step + 1, groups, local, graded, causes, failed)
            row = {"step": step + 1} | sampling_stats(causes, rounds, failed) | features.after_grading(now)
            if pipeline.max_staleness:  # the worker's own sampling time; what the trainer waited for it
                row |= {"async/staleness": step - drawn.version, "async/wait": drawn.waited}
                if config.async_rollouts.in_flight == "continue":
                    row |= in_flight_metrics(step, local)
            if groups:
                row |= rollout_metrics(groups, config, drawn.seconds if pipeline.max_staleness else t1 - t0)
                sampled_tokens += round(row["response_length"] * sum(len(g.rollouts) for g in groups))
                for g in groups[: config.log_rollouts]:
                    # sampled by the weights after `step` updates: the policy version
                    for rec in rollout_record(
                        step + 1, g, tokenizer, functools.partial(origin.row, policy_version=drawn.version)
                    ):
                        rollouts.log(rec)
                # 3. tensors, what the features add, reference logprobs and values (no grad), advantages
                batch = to_batch(local)
                with precision.applied(*policies, reference):
                    prepared = prepare(
                        batch, trainable, reference, config, accelerator, features.extras(now, batch)
                    )
                t2 = time.perf_counter()
                # 4. policy (and value) updates, gradients averaged over processes; 5. sync the sampler
                lr = lr_at(
                    step, lr=config.lr, max_steps=config.steps, warmup_steps=config.warmup_steps,
                    schedule=config.schedule,
                )  # fmt: skip
                with precision.applied(*policies):
                    stats, tokens = update(trainable, optimizer, prepared, config, step, lr, accelerator)
                trained_tokens += int(
                    accelerator.reduce(torch.tensor(tokens, device=accelerator.device), "sum")
                )
                trained.publish()  # fsdp: the full weights into the bare model the sampler reads
                if not pipeline.owns_engine:  # else the worker syncs each job's weights into the engine
                    sampler.sync(model)
                t3 = time.perf_counter()
                row |= update_metrics(stats, prepared, accelerator) | {
                    "lr": lr,
                    "time/prepare": t2 - t1,
                    "time/train": t3 - t2,
                    "train_tokens_per_s": tokens * world / max(t3 - t2, 1e-9),
                }
            elif main:
                console.print(f"[yellow]rl[/]: step {step + 1} kept no group with a learning signal")
            # 6. eval, the features' metrics of the whole row (the monitors), log
            if evaluate is not None and _eval_due(config, step + 1):
                model.eval()
                row |= {f"eval/{k}": v for k, v in distributed.on_main(evaluate, step + 1).items()}
            row |= features.after_step(now, row)
            log.log(row)
            history.append(row)
            progress.update(
                bar,
                advance=1,
                info=f"reward {row.get('reward', float('nan')):.3f} acc {row.get('accuracy', float('nan')):.3f}",
            )
            for cb in callbacks:
                cb(step + 1, row)
            # 7. checkpoint
            if config.save_every and (step + 1) % config.save_every == 0:
                totals = {"sampled_tokens": sampled_tokens, "trained_tokens": trained_tokens}
                totals["seconds"] = time.perf_counter() - t_start
                files = {PIPELINE_FILE: pipeline.versions()} if pipeline.max_staleness else {}
                save_checkpoint(
                    out_dir / "checkpoints",
                    step + 1,
                    accelerator,
                    totals=totals,
                    files=files,
                    trained=trained,
                )
    model.eval()
    log.close()
    seconds = time.perf_counter() - t_start
    return RLResult(config.steps, history, seconds, sampled_tokens, trained_tokens, precision.as_dict())
