"""The RL trainer: sample a batch of prompts x group -> grade -> advantages -> policy epochs -> sync.

One loop serves the GRPO family (group-relative outcome advantages: grpo, dr_grpo, rloo,
reinforce_pp) and PPO (a value head and GAE over token rewards). Departures from the textbook
loop, each a small function below:
1. DAPO dynamic sampling (Yu et al. 2025 §3.2): groups whose rewards are all equal are dropped
   and more prompts are drawn until the batch is full or `max_sampling_rounds` is reached.
2. The importance ratio is taken against the sampler's logprobs (no second forward pass to
   recompute "old" logprobs; tests check the sampler matches teacher forcing).
3. KL to the frozen reference either as a loss term (k3, GRPO) or in the reward (k1, RLHF).
4. Every step logs the zero-variance share by cause, not just the reward.
5. Data parallel (N processes, see `train_rl`): each process samples, grades and trains on its
   share of the step's groups; one process gives the same losses at the same global batch.
"""

from __future__ import annotations

import math
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
from temper.envs.base import make_env
from temper.jsonl import iter_jsonl
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import resolve_precision
from temper.rewards import BATCH_COMPONENTS, monitors
from temper.rewards.diagnostics import breakdown
from temper.rewards.judge import GroupScorer
from temper.rewards.path import declared_signals, episode_totals, path_errors, path_metrics, signal_errors
from temper.rewards.process_reward_model import PRM
from temper.rollout import HFSampler, Sampler
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import derive_seed
from temper.rollout.trajectory import mean_signals
from temper.tasks.base import Problem, Task
from temper.train import adaptthink, user_code
from temper.train.checkpoint import resume, save_checkpoint
from temper.train.metrics import MetricsLog, progress_bar
from temper.train.privileged import check_no_leak, privileged_text, teacher_prompts
from temper.train.rl_config import RLConfig
from temper.train.rl_update import policy_with_value, prepare, update
from temper.train.rollouts import Group, grade_episodes, rollout_record, to_batch
from temper.train.schedule import lr_at
from temper.train.user_code import GroupFailure, group_failure

__all__ = [
    "RLConfig",
    "RLResult",
    "collect_groups",
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


def problems_for_step(
    tasks: list[Task], n: int, seed: int, step: int, stream: int = 0
) -> list[tuple[Task, Problem]]:
    """n training problems, a pure function of (seed, step, stream): resume replays them exactly.
    Stream 0 is the step's batch; refill rounds of dynamic sampling draw from other streams.
    A task with `sample_at_step` is told the step (a curriculum over training: the noise of
    `simulated_search`, the pool `code_repair` grows from failures): what changes with the step is
    part of the drawn problems."""
    out = []
    for i, task in enumerate(tasks):
        k = n // len(tasks) + (i < n % len(tasks))
        key = derive_seed(seed, step, stream, i)
        at_step = getattr(task, "sample_at_step", None)
        drawn = at_step("train", k, seed=key, step=step) if at_step else task.sample("train", k, seed=key)
        out += [(task, p) for p in drawn]
    return out


def sample_share(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    step: int,
    rank: int = 0,
    world: int = 1,
    graded: list[Group] | None = None,
    scorers: dict[str, GroupScorer] | None = None,
) -> tuple[list[Group], list[str | None], int, list[GroupFailure]]:
    """This process's share of the step's groups, sampled and graded -> (groups, the zero-variance
    cause of every first-round group, sampling rounds, each group left out because user code (an
    environment, the grader) failed or hung, or the template rewrote the history).

    Round 0 is the step's global batch of `prompts_per_step` problems; process `rank` takes its
    contiguous share, and prompt i of the global batch is sampled with the seed of its global
    index, so a group is the same whichever process draws it (and the run equals one process at
    the same global batch). With dynamic sampling (DAPO, Yu et al. 2025 §3.2) constant-reward
    groups are dropped and EACH PROCESS REFILLS ITS OWN SHARE from its own problem stream, so no
    process waits for another while sampling; like DAPO, a refill round over-samples by the share
    of groups the previous round kept (at most 4x). `graded`, when given, receives every graded
    group of every round, the dropped ones included (a curriculum grows from the all-fail ones).
    `scorers` score the batch reward components (a reward model) once per round, over all its
    episodes."""
    share = distributed.share(config.prompts_per_step, rank, world)
    want = share.stop - share.start
    kept: list[Group] = []
    causes: list[str | None] = []
    failed: list[GroupFailure] = []
    rounds, keep_rate = 0, 1.0
    while len(kept) < want and rounds < (config.max_sampling_rounds if config.dynamic_sampling else 1):
        need = want - len(kept)
        before = len(kept)
        if rounds == 0:
            stream, index = 0, range(config.prompts_per_step)[share]
            drawn = problems_for_step(tasks, config.prompts_per_step, config.seed, step)[share]
        else:
            stream = rounds * world + rank  # a stream per (round, process): refills never overlap
            draw = min(4 * need, math.ceil(need / max(keep_rate, 0.25)))
            index, drawn = range(draw), problems_for_step(tasks, draw, config.seed, step, stream)
        envs = [[make_env(task, problem) for _ in range(config.group_size)] for task, problem in drawn]
        episodes = run_episodes(
            sampler,
            tokenizer,
            envs,
            [derive_seed(config.seed, step, stream, i) for i in index],
            episode_limits(config),
            temperature=config.temperature,
            top_p=config.top_p,
        )
        given = given_parts(scorers or {}, [p for _, p in drawn], episodes)
        for (_, problem), trajectories, parts in zip(drawn, episodes, given, strict=True):
            group = grade_episodes(
                problem,
                trajectories,
                config.rewards,
                config.max_new_tokens,
                config.overlong_buffer,
                config.path,
                parts,
            )
            if (failure := group_failure(group, rounds == 0)) is not None:
                # user code that failed or hung (an env, the grader) is not the policy's doing: a
                # reward of 0 would teach it something false, so the group is left out (and counted)
                failed.append(failure)
                continue
            if graded is not None:
                graded.append(group)
            if rounds == 0:
                causes.append(group.cause)  # the breakdown describes the policy, before filtering
            if not config.dynamic_sampling or group.cause is None:
                kept.append(group)
        keep_rate = (len(kept) - before) / max(len(drawn), 1)
        rounds += 1
    return kept[:want], causes, rounds, failed


def given_parts(
    scorers: dict[str, GroupScorer], problems: list[Problem], episodes: list[list[Any]]
) -> list[list[dict[str, float]] | None]:
    """Per group, per episode, the values of the batch reward components (None: there are none),
    each scorer called once over the whole sampling round."""
    given: list[list[dict[str, float]] | None] = [None] * len(problems)
    for scorer in scorers.values():
        for g, parts in enumerate(scorer(problems, episodes)):
            given[g] = [a | b for a, b in zip(given[g] or [{}] * len(parts), parts, strict=True)]
    return given


def grow_curricula(curricula: dict[str, Any], graded: list[Group], step: int) -> dict[str, float]:
    """Every process's graded problems of the step (all sampling rounds), gathered, each with
    whether its whole group failed, handed to its task's curriculum, which grows its pool from
    the failures (the same pool in every process); the curricula's metrics."""
    drawn = distributed.gather([
        (g.rollouts[0].problem.task, g.rollouts[0].problem.id, not any(r.score.correct for r in g.rollouts))
        for g in graded if g.rollouts
    ])  # fmt: skip
    row: dict[str, float] = {}
    for name, curriculum in curricula.items():
        row |= curriculum.after_step(step, [(pid, failed) for task, pid, failed in drawn if task == name])
    return row


def episode_limits(config: RLConfig) -> EpisodeLimits:
    return EpisodeLimits(
        config.max_turns, config.max_episode_tokens, config.max_new_tokens, config.step_timeout
    )


def _failed_stats(failed: list[GroupFailure]) -> dict[str, float]:
    """env_failed_groups: the groups left out because user code failed or hung (an env, the
    grader: `user_code.LEFT_OUT`) or the chat template re-rendered the history differently from
    what was sampled (splitting such an episode into a second training row is not implemented)."""
    return {"env_failed_groups": len(failed)} if failed else {}


def sampling_stats(causes: list[str | None], rounds: int, kept: int, config: RLConfig) -> dict[str, float]:
    stats = breakdown(causes) | {"sampling_rounds": rounds}
    if config.dynamic_sampling:
        stats["kept_groups"] = kept
    return stats


def collect_groups(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    step: int,
    scorers: dict[str, GroupScorer] | None = None,
    failed: list[GroupFailure] | None = None,
) -> tuple[list[Group], dict[str, float]]:
    """All `prompts_per_step` groups of a step in this process (the reachability probe, tests);
    `failed`, when given, receives the groups left out (`user_code.GroupFailure`)."""
    kept, causes, rounds, left_out = sample_share(sampler, tokenizer, tasks, config, step, scorers=scorers)
    if failed is not None:
        failed += left_out
    return kept, sampling_stats(causes, rounds, len(kept), config) | _failed_stats(left_out)


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
    the gradients, so the losses equal one process's at the same global batch (GRPO in
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
    if config.kl_coef > 0 and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    if config.teacher_context != "none":
        if reference is None or config.kl_coef <= 0:
            raise ValueError("teacher_context needs a teacher (the reference) and kl_coef > 0")
        if envs := [t.name for t in tasks if getattr(t, "make_env", None) is not None]:
            raise ValueError(f"teacher_context: single-turn tasks only; {envs} are environment tasks")
    scorers = scorers or {}
    if missing := [n for n in config.rewards if n in BATCH_COMPONENTS and n not in scorers]:
        raise ValueError(f"reward component {missing[0]!r} needs a scorer: {BATCH_COMPONENTS[missing[0]]}")
    if PRM in config.rewards and config.process_reward_model_mode == "dense" and config.advantage != "gae":
        raise ValueError(
            "process_reward_model_mode dense puts step rewards on tokens: it needs advantage gae "
            "(or use min / product, one outcome score per completion)"
        )
    if config.prompts_per_step % world:
        raise ValueError(f"prompts_per_step {config.prompts_per_step} is not divisible by {world} processes")
    # the RLVP principles, checked here too for runs that bypass the recipe (the CLI, the API)
    if bad := path_errors(config.path, config.rewards) + signal_errors(config.path, config.rewards, tasks):
        raise ValueError("; ".join(f"train.{'.'.join(map(str, loc))}: {msg}" for loc, msg in bad))
    kinds = declared_signals(tasks)[0]
    sampler = sampler or HFSampler(
        model,
        tokenizer,
        precision=resolve_precision(
            config.precision, model, "sample", record=Path(out_dir) / PRECISION_RECORD
        ),
    )
    trainable = policy_with_value(model, config)  # the policy and, for PPO, its value head
    params = [p for p in trainable.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.99))
    # DDP wraps the one module the update differentiates; the sampler keeps the bare model, whose
    # parameters are the same tensors, so sampling and evaluation run no collective
    trainable, optimizer = accelerator.prepare(trainable, optimizer)

    # after the accelerator: rank 0 decides (a resumed run keeps its recorded choice)
    precision = resolve_precision(config.precision, model, record=Path(out_dir) / PRECISION_RECORD)
    # AdaptThink: the reference accuracy of every prompt the run will train on, from the starting
    # weights (before a checkpoint is loaded; a resumed run reads the file back), and the rollout
    # that forces the first token
    ref_accuracy: dict[str, float] = {}
    train_sampler = sampler
    if config.advantage == "adaptthink":
        if config.adaptthink is None:
            raise ValueError("advantage 'adaptthink' needs the train.adaptthink block (delta, direct_share)")
        if config.dynamic_sampling:
            raise ValueError(
                "adaptthink: dynamic sampling would train on prompts without a reference accuracy"
            )
        every = [
            p
            for step in range(config.steps)
            for p in problems_for_step(tasks, config.prompts_per_step, config.seed, step)
        ]
        ref_accuracy = distributed.on_main(
            adaptthink.reference_accuracy,
            sampler,
            tokenizer,
            every,
            config.adaptthink.reference_samples,
            episode_limits(config),
            temperature=config.temperature,
            top_p=config.top_p,
            seed=config.seed,
            out_dir=out_dir if main else None,
        )
        if config.adaptthink.direct_share is not None:
            train_sampler = adaptthink.ForcedFirstToken(sampler, tokenizer, config.adaptthink.direct_share)
    log = MetricsLog(out_dir / "metrics.jsonl", main, trackers=config.trackers, config=asdict(config))
    rollouts = MetricsLog(out_dir / "rollouts.jsonl", enabled=main)
    start, totals = resume(out_dir / "checkpoints", accelerator)
    if start:
        log.truncate_after(start)
        rollouts.truncate_after(start)  # replayed steps are logged again
    elif main:
        for path in (log.path, rollouts.path):
            path.unlink(missing_ok=True)
    # tasks whose train pool grows from the policy's failures (envs/code_repair/curriculum.py)
    curricula = {t.name: c for t in tasks if (c := getattr(t, "failure_curriculum", None)) is not None}
    for curriculum in curricula.values():
        curriculum.resume(out_dir, start, main)
    accelerator.wait_for_everyone()
    # the monitors' trailing window: a resumed run reads its steps so far back from the log
    past = (
        [r for _, _, r in iter_jsonl(log.path) if isinstance(r, dict)] if start and log.path.exists() else []
    )
    flagged: set[str] = set()
    for r in past:
        monitors.new_flags(r, flagged)
    violations = [
        n for t in tasks for n, kind in getattr(t, "path_signals", {}).items() if kind == "violation"
    ]

    # failures of user code and steps without a learning signal: counted, printed, a stop
    policy = user_code.Policy(
        config.user_code, config.steps, user_code.console_line(console) if main else None, start,
        user_code.equal_rewards_teach_nothing(config),
    )  # fmt: skip
    # a resumed run's result is the whole run's: its rows and totals before the resume come back
    history: list[dict[str, Any]] = list(past)
    sampled_tokens, trained_tokens = totals.get("sampled_tokens", 0), totals.get("trained_tokens", 0)
    t_start = time.perf_counter() - totals.get("seconds", 0.0)
    progress = progress_bar(config.progress and main)
    with progress:
        bar = progress.add_task(out_dir.name or "rl", total=config.steps, completed=start, info="")
        for step in range(start, config.steps):
            # 1. sample and grade this process's share; metrics describe the gathered global batch
            t0 = time.perf_counter()
            model.eval()
            graded: list[Group] | None = [] if curricula else None
            local, causes, rounds, failed = sample_share(
                train_sampler, tokenizer, tasks, config, step, rank, world, graded, scorers
            )
            if world > 1:  # equal shares: every process must run the same collectives below
                local = local[: min(distributed.gather([len(local)]))]
                causes, rounds = distributed.gather(causes), max(distributed.gather([rounds]))
                failed = distributed.gather(failed)
            groups = distributed.gather(local)
            t1 = time.perf_counter()
            row = (
                {"step": step + 1}
                | sampling_stats(causes, rounds, len(groups), config)
                | _failed_stats(failed)
            )
            row |= policy.after_sampling(step + 1, causes, failed, config.group_size)
            if curricula:
                row |= grow_curricula(curricula, graded, step + 1)
            if groups:
                row |= rollout_metrics(groups, config, t1 - t0, kinds)
                sampled_tokens += round(row["response_length"] * sum(len(g.rollouts) for g in groups))
                for g in groups[: config.log_rollouts]:
                    for rec in rollout_record(step + 1, g, tokenizer):
                        rollouts.log(rec)
                # 2. tensors, reference logprobs and values (no grad), advantages
                batch = to_batch(local)
                if ref_accuracy:
                    row |= adaptthink.step_metrics(groups, tokenizer, ref_accuracy)
                    row["adaptthink/p_direct"] = adaptthink.direct_probability(
                        model,
                        [g.rollouts[0].trajectory.prompt_ids for g in local],
                        tokenizer,
                        config.temperature,
                    )
                    batch.direct_R = adaptthink.direct_flags(
                        [adaptthink.first_token(r.trajectory) for g in local for r in g.rollouts], tokenizer
                    )
                    batch.ref_accuracy_G = torch.tensor(
                        [ref_accuracy[g.rollouts[0].problem.id] for g in local]
                    )
                if config.teacher_context == "solution":
                    batch.teacher_prompts = _privileged_prompts(tokenizer, tasks, local, batch.prompts)
                with precision.applied(model, reference):
                    prepared = prepare(batch, trainable, reference, config, accelerator)
                t2 = time.perf_counter()
                # 3. policy (and value) updates, gradients averaged over processes
                lr = lr_at(
                    step,
                    lr=config.lr,
                    max_steps=config.steps,
                    warmup_steps=config.warmup_steps,
                    schedule=config.schedule,
                )
                with precision.applied(model):
                    stats, tokens = update(trainable, optimizer, prepared, config, step, lr, accelerator)
                trained_tokens += int(
                    accelerator.reduce(torch.tensor(tokens, device=accelerator.device), "sum")
                )
                sampler.sync(model)
                t3 = time.perf_counter()
                row |= _mean_over_processes(
                    {k: sum(v) / len(v) for k, v in stats.items()} | _ref_kl_sums(prepared), accelerator
                )
                if "kl_ref/sum" in row:
                    total = row.pop("kl_ref/sum")
                    row["kl_ref"] = total / max(row.pop("kl_ref/tokens"), 1)
                    # per sequence: the KL of Gao et al.'s over-optimization axis (sqrt KL)
                    row["kl_ref_seq"] = total / max(row.pop("kl_ref/rows"), 1)
                row |= {
                    "lr": lr,
                    "time/prepare": t2 - t1,
                    "time/train": t3 - t2,
                    "train_tokens_per_s": tokens * world / max(t3 - t2, 1e-9),
                }
            elif main:
                console.print(f"[yellow]rl[/]: step {step + 1} kept no group with a learning signal")
            if (
                evaluate is not None
                and config.eval_every
                and ((step + 1) % config.eval_every == 0 or step + 1 == config.steps)
            ):
                model.eval()
                row |= {f"eval/{k}": v for k, v in distributed.on_main(evaluate, step + 1).items()}
            if config.monitors.enabled:
                done = [r for g in groups for r in g.rollouts]
                row |= monitors.step_monitors(
                    row, past, [r.reward for r in done], [r.tokens for r in done], config.monitors, violations
                )
                past = [*past[-config.monitors.window :], row]
                for name in monitors.new_flags(row, flagged):
                    if main:
                        console.print(
                            f"[yellow]rl[/]: step {step + 1}: reward-hacking monitor {name} flagged "
                            f"({row.get('monitor/' + name, float('nan')):.3g}): {monitors.meaning(name)}"
                        )
            log.log(row)
            history.append(row)
            progress.update(
                bar,
                advance=1,
                info=f"reward {row.get('reward', float('nan')):.3f} acc {row.get('accuracy', float('nan')):.3f}",
            )
            for cb in callbacks:
                cb(step + 1, row)
            if config.save_every and (step + 1) % config.save_every == 0:
                totals = {"sampled_tokens": sampled_tokens, "trained_tokens": trained_tokens}
                totals["seconds"] = time.perf_counter() - t_start
                save_checkpoint(out_dir / "checkpoints", step + 1, accelerator, totals=totals)
    model.eval()
    log.close()
    seconds = time.perf_counter() - t_start
    return RLResult(config.steps, history, seconds, sampled_tokens, trained_tokens, precision.as_dict())


def _privileged_prompts(tokenizer, tasks: list[Task], groups: list[Group], student: list[list[int]]):
    """OPSD: the teacher's prompt of every row (the solution added), after checking that no
    student prompt of the batch holds its row's privileged text."""
    by_name = {t.name: t for t in tasks}
    problems = [r.problem for g in groups for r in g.rollouts]
    check_no_leak(tokenizer, student, [privileged_text(by_name[p.task], p) for p in problems])
    return teacher_prompts(tokenizer, by_name, problems)


def _ref_kl_sums(prepared) -> dict[str, float]:
    """k1 to the reference summed over this process's completion tokens, their count and the
    count of sequences."""
    if prepared.ref_kl is None:
        return {}
    return {
        "kl_ref/sum": float((prepared.ref_kl * prepared.mask).sum()),
        "kl_ref/tokens": float(prepared.mask.sum()),
        "kl_ref/rows": float(prepared.mask.shape[0]),
    }


def _mean_over_processes(values: dict[str, float], accelerator: Accelerator) -> dict[str, float]:
    """Per-process values averaged over processes (sums: `/sum` and `/tokens` keys, added up)."""
    if accelerator.num_processes == 1:
        return values
    keys = sorted(values)
    t = accelerator.reduce(torch.tensor([values[k] for k in keys], dtype=torch.float64), "sum")
    world = accelerator.num_processes
    return {k: float(v) if k.startswith("kl_ref/") else float(v) / world for k, v in zip(keys, t.tolist())}


def rollout_metrics(
    groups: list[Group], config: RLConfig, seconds: float, kinds: dict[str, str] | None = None
) -> dict[str, float]:
    """Means over the step's samples: reward (total and per component), accuracy, format, length;
    for multi-turn episodes also turns, environment time and the share of each stop reason.
    When the tasks declare path signals (`kinds`, signal -> kind) also the path metrics, with or
    without a path reward (an outcome-only run is compared on them): violations per episode,
    compliance rate, path/phi (with `config.path`), and path/all_fail_groups, the share of the
    step's trained groups whose outcome is all wrong whatever their path term
    (`Group.outcome_all_fail`; with dynamic sampling only the kept groups are counted)."""
    rollouts = [r for g in groups for r in g.rollouts]
    n = len(rollouts)
    new_tokens = sum(r.tokens for r in rollouts)
    row = {
        "reward": sum(r.reward for r in rollouts) / n,
        "accuracy": sum(r.score.correct for r in rollouts) / n,
        "parse_rate": sum(r.score.parsed for r in rollouts) / n,
        "truncation_rate": sum(r.trajectory.truncated for r in rollouts) / n,
        "response_length": new_tokens / n,
        "rollout_tokens_per_s": new_tokens / max(seconds, 1e-9),
        "time/sample": seconds,
    }
    row |= {f"reward/{name}": sum(r.parts[name] for r in rollouts) / n for name in config.rewards}
    if any(name in BATCH_COMPONENTS for name in config.rewards):
        # a learned (proxy) reward: the verifier's reward of every sample, whatever its weight (0:
        # never trained on), is the gold the proxy is judged by (Gao et al. 2023)
        row["reward/gold"] = sum(r.score.reward for r in rollouts) / n
    if "prm_min" in rollouts[0].parts:  # a process reward model's weakest step and step count
        row["prm/min_step"] = sum(r.parts["prm_min"] for r in rollouts) / n
        row["prm/steps"] = sum(r.parts["prm_steps"] for r in rollouts) / n
    if "judge_parsed" in rollouts[0].parts:  # verdicts the judge wrote that could not be read
        row["judge/unparseable"] = sum(r.parts["judge_parsed"] == 0 for r in rollouts)
    functions: dict[str, list[float]] = {}  # a data task's reward functions, each on its own (as TRL
    for r in rollouts:  # logs rewards/<name>/mean), over the samples each one graded (None: not applicable)
        for name, value in (r.score.details.get("rewards") or {}).items():
            if value is not None:
                functions.setdefault(name, []).append(value)
    row |= {f"reward_fn/{name}": sum(v) / len(v) for name, v in functions.items()}
    if any(len(r.trajectory.segments) > 2 for r in rollouts):  # an agent run: per-episode facts
        row |= episode_metrics([r.trajectory for r in rollouts])
    if kinds:
        totals = [episode_totals(r.trajectory.signals) for r in rollouts]
        phis = [r.parts["path"] for r in rollouts] if config.path is not None else None
        row |= path_metrics(totals, kinds, phis)
        row["path/all_fail_groups"] = sum(g.outcome_all_fail for g in groups) / len(groups)
    return row


def episode_metrics(trajectories: list) -> dict[str, float]:
    """Turns per episode, environment seconds per episode, the share of each stop reason, and the
    mean per episode of every numeric step signal (tool calls, tool errors, invalid moves...)."""
    n = len(trajectories)
    row = {
        "episode/turns": sum(t.turns for t in trajectories) / n,
        "episode/env_seconds": sum(t.seconds_in_env for t in trajectories) / n,
        "episode/tokens": sum(len(t.completion_ids) for t in trajectories) / n,
    }
    for reason in sorted({t.stop_reason for t in trajectories}):
        row[f"episode/stop_{reason}"] = sum(t.stop_reason == reason for t in trajectories) / n
    return row | {f"signal/{k}": v for k, v in mean_signals(trajectories).items()}
