"""Settings of one RL stage: what a recipe's `rl` stage `train:` block holds, and its rules.

The core settings are grouped as sampling, advantage, loss, optimisation and the run (seed,
evals, checkpoints, logging); every other key is the block of an RL feature
(`temper.train.features`), added by `with_feature_blocks` and checked by that feature's rules.
`rl_rules` is the one check of a block (the recipe runs it when it is validated; `train_rl`
runs it again for callers that bypass the recipe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from temper.algorithms.estimators import ESTIMATORS
from temper.algorithms.policy import Aggregation
from temper.catalog import TASKS
from temper.precision import Precision
from temper.rewards import BATCH_COMPONENTS, COMPONENTS
from temper.rewards.path import PRINCIPLES
from temper.tasks.base import path_signals_of
from temper.train.features import StageView, with_feature_blocks
from temper.train.features import hashed as feature_hashed
from temper.train.features import rules as feature_rules
from temper.train.features import task_rules as feature_task_rules
from temper.train.features.base import Error, at
from temper.train.metrics import Tracker
from temper.train.schedule import Schedule
from temper.train.strategy import Strategy

Advantage = Literal[tuple(ESTIMATORS)]  # type: ignore[valid-type]
"""The names of `temper.algorithms.estimators.ESTIMATORS`."""
KLMode = Literal["loss", "reward"]


@dataclass
@with_feature_blocks
class RLConfig:
    """Settings of one RL stage: the core fields below, grouped, then one block per RL feature
    (`temper.train.features`, e.g. `adaptthink`, `path`, `monitors`). The `Annotated` ranges are
    checked when a recipe or a CLI flag sets a field (plain construction does not check them);
    cross-field rules are `rl_rules`."""

    HASHED_WHEN_SET: ClassVar[tuple[str, ...]] = ("strategy",)
    """Core fields added after runs were recorded: left out of the stage hash while at their
    defaults (`stages.markers.stage_settings`), so those runs stay complete. A feature's block
    says so itself (`RLFeature.hashed_when_set`)."""

    # ---- sampling: what a step draws and how it is graded
    steps: Annotated[int, Field(ge=1)] = 50
    """RL steps (one rollout batch and its updates each)."""
    prompts_per_step: Annotated[int, Field(ge=1)] = 16
    group_size: Annotated[int, Field(ge=1)] = 8
    """Samples per prompt (G in GRPO)."""
    max_new_tokens: Annotated[int, Field(ge=1)] = 48
    """Tokens per sampler call (per turn, or per piece of a turn between inline tool answers)."""
    max_turns: Annotated[int, Field(ge=1)] = 8
    """Actions per episode of an environment task (a single-turn task always takes one)."""
    max_episode_tokens: Annotated[int, Field(ge=0)] = 0
    """Policy and environment tokens per episode after the prompt (0: max_turns x max_new_tokens)."""
    step_timeout: Annotated[float, Field(gt=0)] = 60.0
    """Seconds one environment step may take; a longer step ends its episode (stop reason timeout)."""
    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    rewards: dict[str, float] = field(default_factory=lambda: {"outcome": 1.0})
    """Reward components and their weights (outcome, format, overlong, process; reward_model: the
    score of `reward_model`; judge: the verdict of `judge`; process_reward_model: the step scores
    of `process_reward_model`). A component of weight 0 is computed and logged, never trained on."""
    overlong_buffer: Annotated[int, Field(ge=0)] = 0
    """DAPO soft overlong window in tokens before max_new_tokens (0: only truncation is penalized)."""

    # ---- advantage
    advantage: Advantage = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp (outcome, group-relative; with process rewards, on the
    episode's total return) | gae (PPO with a value head) | turn_grpo | turn_reinforce (per turn:
    the return from each turn against the group's returns at the same turn index) |
    on_policy_distill (per token, the teacher's logprob minus the student's: the rl stage's `teacher`
    is the reference, `kl_coef` the scale, `kl_mode: reward`) | adaptthink (delta * 1(direct) + r -
    the starting model's accuracy on the prompt, with the `adaptthink` block)."""
    grpo_eps: Annotated[float, Field(ge=0)] = 1e-6
    """epsilon added to the group std by grpo (verl's default; TRL uses 1e-4)."""
    whiten_advantages: bool = True
    """gae: whiten advantages over the batch's completion tokens (verl's default)."""
    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    turn_gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount across the turns of an episode for turn_grpo / turn_reinforce: the return from turn
    k is sum_{j>=k} turn_gamma^(j-k) step_reward_j + turn_gamma^(last-k) outcome. 1 credits every
    turn with all that follows it; < 1 credits a turn mostly with its own process reward."""

    # ---- loss
    clip_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """PPO clip range below 1 (epsilon_low)."""
    clip_high: Annotated[float, Field(ge=0)] = 0.2
    """PPO clip range above 1 (epsilon_high; DAPO clip-higher uses 0.28)."""
    dual_clip: Annotated[float, Field(gt=1)] | None = 3.0
    """Dual-clip PPO: the loss of a token with negative advantage is capped at dual_clip x |A|
    (verl's clip_ratio_c default 3, which verl requires > 1; null disables). Inactive on the first epoch over fresh samples."""
    aggregation: Aggregation = "token"
    """token (DAPO) | sample (GRPO) | constant (Dr. GRPO: sum / (rows x max_new_tokens))."""
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    """beta of the KL to the frozen reference; 0 = no reference model."""
    kl_mode: KLMode = "loss"
    """loss (k3 estimator as a loss term, GRPO) | reward (k1 subtracted from the reward, RLHF)."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the entropy bonus (subtracted from the loss, reduced like the policy loss)."""
    vf_coef: Annotated[float, Field(ge=0)] = 0.5
    """Weight of the value loss (gae); the value loss is always a token mean."""
    value_clip: Annotated[float, Field(ge=0)] = 0.2

    # ---- optimisation
    epochs: Annotated[int, Field(ge=1)] = 1
    """Optimizer passes over each rollout batch."""
    minibatches: Annotated[int, Field(ge=1)] = 1
    """Optimizer steps per epoch."""
    micro_batch_size: Annotated[int, Field(ge=0)] = 0
    """Sequences per forward pass (packed into rows without padding); 0 = the whole minibatch."""
    lr: Annotated[float, Field(gt=0)] = 1e-4
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    schedule: Schedule = "constant"
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    grad_clip: Annotated[float, Field(ge=0)] = 1.0
    strategy: Strategy = "ddp"
    """ddp | fsdp: how several processes (torchrun) share the trained module: ddp keeps it whole
    in each, fsdp shards parameters, gradients and optimizer state (torch FSDP2,
    `temper.train.strategy`) and gathers the full weights for the sampler after each update; the
    same losses. One process trains the model itself either way."""
    dropout: bool = False
    """Keep the model's dropout in the RL update and the reference/value passes. Off by default:
    with dropout the first update is already off-policy (ratio != 1 before any step)."""

    # ---- the run: seed, evals, checkpoints, logging
    seed: int = 0
    eval_every: Annotated[int, Field(ge=0)] = 0
    """Steps between greedy evals on the test split (0: none)."""
    eval_problems: Annotated[int, Field(ge=1)] = 64
    save_every: Annotated[int, Field(ge=0)] = 0
    log_rollouts: Annotated[int, Field(ge=0)] = 2
    """Groups per step written to rollouts.jsonl."""
    progress: bool = True
    precision: Precision = "fp32"
    """fp32 | bf16 (autocast over fp32 weights) | auto (bf16 only where it measures faster here);
    training and the hf sampler each decide on their own."""
    trackers: list[Tracker] = field(default_factory=list)
    """Experiment trackers that also get the metrics, e.g. [tensorboard]; metrics.jsonl always."""

    def hashed_blocks(self) -> tuple[set[str], dict[str, Any]]:
        """(the feature blocks the stage hash leaves out as they dump, the `train:` keys it covers
        instead): a block that replaced flat keys hashes as those keys did, and a block added after
        runs were recorded is left out at its default (`stages.markers.stage_settings`)."""
        return feature_hashed(self)


def core_rules(config: RLConfig, stage: StageView | None = None) -> list[Error]:
    """Cross-field rules of the core settings (the ranges are on the fields), located below the
    `train:` block; the stage's `teacher` rules with them."""
    stage = stage or StageView()
    estimator = ESTIMATORS[config.advantage]
    out: list[Error] = []
    if config.group_size < estimator.min_group:
        out.append(
            (
                ("group_size",),
                f"must be at least {estimator.min_group} with advantage {config.advantage!r}: its baseline is the "
                "other samples of the group, so a group of 1 has advantage 0 and learns nothing",
            )
        )
    if config.warmup_steps >= config.steps:
        out.append(
            (
                ("warmup_steps",),
                f"{config.warmup_steps} must be below steps ({config.steps}): the lr would never reach its peak",
            )
        )
    out += [
        (("rewards", name), _unknown_component(name))
        for name in config.rewards
        if name not in COMPONENTS and name not in BATCH_COMPONENTS
    ]
    rows = config.prompts_per_step * config.group_size
    if config.minibatches > rows:
        out.append(
            (
                ("minibatches",),
                f"must be at most prompts_per_step x group_size ({rows}): each minibatch needs a sample",
            )
        )
    if config.overlong_buffer >= config.max_new_tokens:
        out.append((("overlong_buffer",), f"must be below max_new_tokens ({config.max_new_tokens})"))
    if config.turn_gamma != 1.0 and not config.advantage.startswith("turn_"):
        out.append(
            (
                ("turn_gamma",),
                f"only the turn estimators (turn_grpo, turn_reinforce) discount across turns; with advantage "
                f"{config.advantage!r} it would have no effect",
            )
        )
    if estimator.needs_reference and config.kl_coef <= 0:
        out.append(
            (
                ("kl_coef",),
                f"must be > 0 with advantage {config.advantage!r}: it scales the teacher's per-token "
                "advantage (1.0 is the plain reverse KL)",
            )
        )
    if estimator.needs_reference and config.kl_mode != "reward":
        out.append(
            (
                ("kl_mode",),
                f"must be 'reward' with advantage {config.advantage!r}: the teacher's KL is the advantage; "
                "as a loss term it would be counted twice",
            )
        )
    return at(("train",), out) + _teacher_rules(config, stage)


def _unknown_component(name: str) -> str:
    """The error for a `rewards` key that is no component; a path signal some task declares (or
    `path` itself) is refused naming RLVP principle 4, since it belongs in `train.path`."""
    signals = {s for cls in TASKS.values() for s in path_signals_of(cls)}
    if name == "path" or name in signals:
        return (
            f"{PRINCIPLES[4]}: {name!r} is {'the path term' if name == 'path' else 'a path signal'}, not a "
            "reward component; path rewards go in `train.path` (rules, milestones), where they are "
            "normalized within the group apart from the outcome"
        )
    return f"unknown reward component {name!r}; valid: {', '.join([*COMPONENTS, *BATCH_COMPONENTS])}"


def _teacher_rules(config: RLConfig, stage: StageView) -> list[Error]:
    out: list[Error] = []
    if ESTIMATORS[config.advantage].needs_reference and not stage.teacher:
        out.append((("teacher",), f"advantage {config.advantage!r} needs a teacher model to learn from"))
    if stage.teacher and config.kl_coef <= 0:
        out.append(
            (
                ("teacher",),
                "a teacher is the KL reference, so it needs train.kl_coef > 0 (with advantage "
                "'on_policy_distill': the scale of its per-token advantage)",
            )
        )
    return out


def rl_rules(config: RLConfig, stage: StageView | None = None) -> list[Error]:
    """Every rule of an rl stage's `train:` block, core and features, located below the stage
    (e.g. ("train", "adaptthink", "direct_share")): the recipe checks them once, when it is
    validated, and formats each at its line."""
    stage = stage or StageView()
    return core_rules(config, stage) + feature_rules(config, stage)


def rl_task_rules(config: RLConfig, tasks: dict) -> list[Error]:
    """The rules of a `train:` block that need the stage's built tasks (name -> Task), located
    below the stage (e.g. the path signals the tasks declare)."""
    return feature_task_rules(config, tasks)
