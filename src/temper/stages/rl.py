"""The RL stage: format gate -> reachability probe -> RL with verifiable rewards -> save."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed, guard
from temper.atomic import atomic_write_json
from temper.catalog import TASKS
from temper.data import contamination
from temper.evaluate import evaluate
from temper.models import load_model, load_tokenizer, save_trained, with_lora
from temper.models.chat import stop_warning, unstopped_specials
from temper.precision import RECORD as PRECISION_RECORD
from temper.precision import resolve_precision
from temper.rewards import BATCH_COMPONENTS, COMPONENTS
from temper.rewards.diagnostics import NO_SIGNAL_SHARE, NO_SIGNAL_WARNING, advice, breakdown
from temper.rewards.judge import JUDGE, judge_scorer, spec_errors
from temper.rewards.path import PRINCIPLES, path_errors, signal_errors
from temper.rewards.process_reward_model import (
    PRM,
    PROCESS_REWARD_MODEL_DIR,
    ProcessRewardModel,
    prm_scorer,
)
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
    rl_rules,
)
from temper.stages.context import StageContext
from temper.stages.judging import load_judge
from temper.stages.loading import load_chat_model, whole_model
from temper.stages.ranking import reward_model_dir, reward_model_use
from temper.tasks.base import Task, TaskOptionError
from temper.train import user_code
from temper.train.rl import RLConfig, collect_groups, problems_for_step, train_rl
from temper.train.rollouts import model_scorer

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
    sampler: Literal["hf", "vllm"] = "hf"
    """Rollout backend: hf (in-process transformers, CPU or GPU) or vllm (GPU; weights synced after
    every update)."""
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

    @model_validator(mode="after")
    def _check(self) -> RLStage:
        errors = [(("train", *loc), msg) for loc, msg in rl_rules(self.train)]
        errors += [(("train", *loc), msg) for loc, msg in path_errors(self.train.path, self.train.rewards)]
        errors += [
            (("train", "rewards", name), _unknown_component(name))
            for name in self.train.rewards
            if name not in COMPONENTS and name not in BATCH_COMPONENTS
        ]
        errors += reward_model_rules(self.train)
        errors += process_reward_model_rules(self.train)
        errors += judge_errors(self.train.judge, self.train.rewards)
        if not self.tasks:
            errors.append((("tasks",), "an rl stage needs at least one task"))
        if self.train.advantage == "on_policy_distill" and not self.teacher:
            errors.append((("teacher",), "advantage 'on_policy_distill' needs a teacher model to learn from"))
        if self.teacher == SELF and self.train.teacher_context == "none":
            errors.append(
                (
                    ("teacher",),
                    "teacher 'self' is the policy itself, so without privileged context "
                    "(train.teacher_context: solution) it would teach nothing",
                )
            )
        if self.train.teacher_context != "none" and not self.teacher:
            errors.append(
                (("train", "teacher_context"), "privileged context is for a teacher: set teacher (e.g. self)")
            )
        if self.teacher and self.train.kl_coef <= 0:
            errors.append(
                (
                    ("teacher",),
                    "a teacher is the KL reference, so it needs train.kl_coef > 0 (with advantage "
                    "'on_policy_distill': the scale of its per-token advantage)",
                )
            )
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


def judge_errors(spec, rewards: dict[str, float]) -> list[tuple[tuple[str | int, ...], str]]:
    """A `judge` reward needs a `train.judge` block, and a judge block a `judge` weight."""
    if spec is None:
        if JUDGE in rewards:
            return [
                (
                    ("train", "rewards", JUDGE),
                    "the judge component needs a judge: add train.judge, e.g. {model: policy} "
                    "or {url: http://host:8000/v1, model: NAME, api_key_env: VAR}",
                )
            ]
        return []
    out = [(("train", "judge", *loc), msg) for loc, msg in spec_errors(spec)]
    if JUDGE not in rewards:
        out.append(
            (("train", "judge"), "is set but `rewards` does not weigh it: add `judge: <weight>` to rewards")
        )
    return out


def _unknown_component(name: str) -> str:
    """The error for a `rewards` key that is no component; a path signal some task declares (or
    `path` itself) is refused naming RLVP principle 4, since it belongs in `train.path`."""
    signals = {s for cls in TASKS.values() for s in (getattr(cls, "path_signals", None) or {})}
    if name == "path" or name in signals:
        return (
            f"{PRINCIPLES[4]}: {name!r} is {'the path term' if name == 'path' else 'a path signal'}, not a "
            "reward component; path rewards go in `train.path` (rules, milestones), where they are "
            "normalized within the group apart from the outcome"
        )
    return f"unknown reward component {name!r}; valid: {', '.join([*COMPONENTS, *BATCH_COMPONENTS])}"


def reward_model_rules(config: RLConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """A `reward_model` component needs `train.reward_model`, and a reward model is named only to
    be used: each error at the key that is wrong (or missing)."""
    if "reward_model" in config.rewards and config.reward_model is None:
        return [
            (
                ("train", "rewards", "reward_model"),
                "the reward_model component needs a reward model: set train.reward_model to an earlier "
                "reward_model stage's name or to a folder saved by one",
            )
        ]
    if config.reward_model is not None and "reward_model" not in config.rewards:
        return [
            (
                ("train", "reward_model"),
                f"{config.reward_model!r} is never used: no reward_model component in train.rewards "
                "(e.g. rewards: {reward_model: 1.0, outcome: 0.0})",
            )
        ]
    return []


def process_reward_model_rules(config: RLConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """A `process_reward_model` component needs `train.process_reward_model` (and the reverse), and
    its dense mode a per-token estimator: an outcome estimator would credit the sum of the step
    scores to the whole completion, which pays for writing more steps, not better ones."""
    used = PRM in config.rewards
    if used and config.process_reward_model is None:
        return [
            (
                ("train", "rewards", PRM),
                "the process_reward_model component needs a process reward model: set "
                "train.process_reward_model to an earlier process_reward_model stage's name or a folder saved by one",
            )
        ]
    if config.process_reward_model is not None and not used:
        return [
            (
                ("train", "process_reward_model"),
                f"{config.process_reward_model!r} is never used: no process_reward_model component in "
                "train.rewards (e.g. rewards: {outcome: 1.0, process_reward_model: 0.5})",
            )
        ]
    if used and config.process_reward_model_mode == "dense" and config.advantage != "gae":
        return [
            (
                ("train", "process_reward_model_mode"),
                f"dense step rewards need a per-token estimator (advantage: gae); advantage "
                f"{config.advantage!r} gives one advantage per sample, which would see only the sum of "
                "the step scores (more steps, more reward). Use min or product: the step scores "
                "aggregated into one outcome score (Lightman et al. 2023)",
            )
        ]
    return []


def process_reward_model_dir(name: str, ctx: StageContext) -> Path:
    """The folder `train.process_reward_model` means: an earlier stage's `<out>/process_reward_model`,
    else a path relative to the recipe's folder."""
    return ctx.export_dir(name, PROCESS_REWARD_MODEL_DIR)


def task_rules(stage: RLStage, tasks: dict[str, Task]) -> list[tuple[tuple[str | int, ...], str]]:
    """Rules that need the stage's tasks (the recipe builds them before checking): the path
    signals a `train.path` names are declared by the tasks with the right kind (RLVP principles
    1, 3 and 4, `temper.rewards.path.signal_errors`)."""
    errors: list[tuple[tuple[str | int, ...], str]] = []
    try:
        mine = stage_tasks(stage, {name: tasks[name] for name in stage.tasks if name in tasks})
    except TaskOptionError as err:
        return [(("task_options", *err.option), str(err))]
    if PRM in stage.train.rewards and (envs := [n for n, t in mine.items() if getattr(t, "make_env", None)]):
        errors.append(
            (
                ("train", "rewards", PRM),
                f"a process reward model scores the steps of single-turn completions; {envs} are environment tasks",
            )
        )
    return errors + [
        (("train", *loc), msg) for loc, msg in signal_errors(stage.train.path, stage.train.rewards, mine)
    ]


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
        if not dataclasses.is_dataclass(config) or hasattr(type(task), "build"):
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


SELF = "self"  # `teacher: self`: on-policy self-distillation


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
    probe = RLConfig(
        **{
            **config.__dict__,
            "prompts_per_step": groups,
            "dynamic_sampling": False,
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


class _AdapterDisabled(torch.nn.Module):
    """The frozen reference of a LoRA policy: the same module with its adapter switched off."""

    def __init__(self, peft_model):
        super().__init__()
        self.peft_model = peft_model

    def forward(self, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(**kwargs)

    def get_output_embeddings(self):
        """lm_head without its adapter, if it has one: the RL update applies it itself (rl_update.PolicyWithValue)."""
        head = self.peft_model.get_output_embeddings()
        return head.get_base_layer() if hasattr(head, "get_base_layer") else head


def run_rl(stage: RLStage, ctx: StageContext, source: Path | str, out: Path) -> Path:
    """The stage (module docstring), every call of user code under `train.user_code.timeout`. A
    run that user code stops before any step trained (no metrics logged, no checkpoint) leaves
    nothing of its own behind (its probe.json): the folder is then as a refused stage leaves it."""
    with guard.time_limit(stage.train.user_code.timeout):
        try:
            return _run_rl(stage, ctx, source, out)
        except guard.UserCodeError:
            trained = (out / "metrics.jsonl").exists() or (out / "checkpoints").exists()
            if not trained and distributed.is_main():
                (out / "probe.json").unlink(missing_ok=True)
            raise


def _run_rl(stage: RLStage, ctx: StageContext, source: Path | str, out: Path) -> Path:
    config = stage.train
    if bad := task_rules(stage, ctx.tasks):  # the CLI builds its tasks without the recipe's check
        raise StageError("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in bad))
    torch.manual_seed(config.seed)
    tokenizer, model = load_chat_model(source, ctx)
    model.eval()
    tasks = stage_tasks(stage, {name: ctx.tasks[name] for name in stage.tasks})
    if stage.sampler == "vllm":
        from temper.rollout.vllm_sampler import VLLMSampler  # imported only where it is asked for

        sampler = VLLMSampler(whole_model(source, "sampler: vllm"), stop_token_ids=stop_ids(model, tokenizer))
    else:
        chosen = resolve_precision(config.precision, model, "sample", record=out / PRECISION_RECORD)
        sampler = HFSampler(model, tokenizer, precision=chosen)
    scorers = {}
    if config.reward_model is not None:
        from temper.rewards.reward_model import RewardModel  # only runs with a learned reward

        learned = RewardModel.load(
            reward_model_dir(config.reward_model, ctx), device=next(model.parameters()).device
        )
        scorers["reward_model"] = model_scorer("reward_model", learned)
    if config.process_reward_model is not None:
        prm = ProcessRewardModel.load(
            process_reward_model_dir(config.process_reward_model, ctx), device=next(model.parameters()).device
        )
        if problem := tokenizer_mismatch(tokenizer, prm.tokenizer):
            raise StageError(
                f"train.process_reward_model {config.process_reward_model!r} does not share the policy's "
                f"tokenizer ({problem}); it scores the policy's token ids"
            )
        scorers[PRM] = prm_scorer(prm, config.process_reward_model_mode)
    if config.judge:
        scorers[JUDGE] = judge_scorer(load_judge(config.judge, ctx, sampler, tokenizer, config.seed))
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
    drawn_from = [t for t in tasks.values() if getattr(t, "sample_at_step", None) is None]
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
            reference = _AdapterDisabled(model)
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
        "monitors": asdict(config.monitors),  # the thresholds the report's monitor table quotes
    }
    if config.reward_model is not None:
        summary["reward_model"] = str(reward_model_dir(config.reward_model, ctx))
    if config.process_reward_model is not None:
        summary["process_reward_model"] = str(process_reward_model_dir(config.process_reward_model, ctx))
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


def tokenizer_mismatch(student, teacher) -> str:
    """'' when the two tokenizers give every token the same id (same vocabulary, same special
    tokens), else the first difference found, in words."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if len(a) != len(b):
        return f"vocabularies of {len(a)} and {len(b)} tokens"
    if a != b:
        token = next(t for t in sorted(a) if a[t] != b.get(t))
        return f"token {token!r} is id {a[token]} for the student and {b.get(token)} for the teacher"
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return f"{name} {getattr(student, name)} vs {getattr(teacher, name)}"
    return ""


def _uses(stage: RLStage) -> list[Use]:
    """What the stage reads besides its source (`StageKind.uses`): a teacher, a judge named by
    stage or folder (not `policy`, not an endpoint's model name) and a reward model (an earlier
    reward_model stage or a folder), so retraining any of them reruns this stage."""
    out: list[Use] = reward_model_use(stage.train.reward_model, ("train", "reward_model"))
    if stage.teacher not in (None, SELF):
        out.append((("teacher",), stage.teacher))
    judge = stage.train.judge
    if judge is not None and judge.url is None and judge.model != "policy":
        out.append((("train", "judge", "model"), judge.model))
    if stage.train.process_reward_model is not None:
        out.append((("train", PRM), stage.train.process_reward_model, PRM))
    return out


def describe(stage: RLStage, recipe: Any) -> str:
    t = stage.train
    gate = f", gate parse rate >= {stage.gate.min_parse_rate}" if stage.gate else ""
    rm = f", reward model {t.reward_model!r}" if t.reward_model else ""
    if t.process_reward_model:
        rm += f", process reward model {t.process_reward_model!r} ({t.process_reward_model_mode})"
    rm += f", KL {t.kl_coef:g} in the {t.kl_mode}" if t.kl_coef else ""
    path = (
        f", path reward beta {t.path.beta:g} ({len(t.path.rules)} rules, {len(t.path.milestones)} milestones)"
        if t.path
        else ""
    )
    teacher = f", teacher {stage.teacher}" if stage.teacher else ""
    own = f", this stage's task options {stage.task_options}" if stage.task_options else ""
    return f"rl ({t.advantage}) on {stage.tasks}, {t.steps} steps x {t.prompts_per_step} prompts x {t.group_size} samples{gate}{rm}{path}{teacher}{own}"


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
