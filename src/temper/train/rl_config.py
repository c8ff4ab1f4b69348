"""Settings of one RL stage: what a recipe's `rl` stage `train:` block holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from temper.algorithms.policy import Aggregation
from temper.precision import Precision
from temper.rewards.judge import JudgeSpec
from temper.rewards.monitors import MonitorConfig
from temper.rewards.path import PathSpec
from temper.train.metrics import Tracker
from temper.train.schedule import Schedule
from temper.train.user_code import UserCodeConfig

Advantage = Literal[
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "gae",
    "turn_grpo",
    "turn_reinforce",
    "on_policy_distill",
    "adaptthink",
]
"""The names of `temper.algorithms.estimators.ESTIMATORS`."""
KLMode = Literal["loss", "reward"]


@dataclass
class AdaptThinkConfig:
    """AdaptThink (Zhang et al. 2025, `temper.algorithms.adaptthink`): with `advantage: adaptthink`,
    the two modes of a `two_mode` task (`temper.tasks.two_mode`: a completion that starts with the
    thinking marker works before it answers, one that starts with `Answer:` answers directly)."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    delta: Annotated[float, Field(ge=0)] = 0.05
    """The bonus of a direct answer: A = delta * 1(direct) + r - Rbar_ref(x). Larger: more direct
    answers at more accuracy lost (the paper: 0.05 for its 1.5B and 7B models)."""
    direct_share: Annotated[float, Field(gt=0, lt=1)] | None = 0.5
    """Importance sampling at the first token: this share of each group starts with the direct
    marker and the rest with the thinking marker, the ratio taken against that share (the paper:
    0.5). null: sample the mode on-policy (a mode the policy stops choosing is never explored again)."""
    reference_samples: Annotated[int, Field(ge=1)] = 8
    """Thinking-mode samples of the starting model per training prompt, drawn before the first
    update, whose mean accuracy is Rbar_ref(x) (the paper: 16)."""


@dataclass
class RLConfig:
    """Settings of one RL stage. The `Annotated` ranges are checked when a recipe or a CLI flag sets
    a field (plain construction does not check them); cross-field rules are in
    `temper.stages.base.rl_rules`."""

    HASHED_WHEN_SET: ClassVar[tuple[str, ...]] = (
        "process_reward_model",
        "process_reward_model_mode",
        "adaptthink",
        "user_code",
    )
    """Fields added after runs were recorded: left out of the stage hash while at their defaults
    (`stages.markers.stage_settings`), so those runs stay complete."""

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
    advantage: Advantage = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp (outcome, group-relative; with process rewards, on the
    episode's total return) | gae (PPO with a value head) | turn_grpo | turn_reinforce (per turn:
    the return from each turn against the group's returns at the same turn index) |
    on_policy_distill (per token, the teacher's logprob minus the student's: the rl stage's `teacher`
    is the reference, `kl_coef` the scale, `kl_mode: reward`) | adaptthink (delta * 1(direct) + r -
    the starting model's accuracy on the prompt, with the `adaptthink` block)."""
    adaptthink: AdaptThinkConfig | None = None
    """AdaptThink's settings (delta, importance sampling share, reference samples); needs
    `advantage: adaptthink` and a `two_mode` task."""
    grpo_eps: Annotated[float, Field(ge=0)] = 1e-6
    """epsilon added to the group std by grpo (verl's default; TRL uses 1e-4)."""
    whiten_advantages: bool = True
    """gae: whiten advantages over the batch's completion tokens (verl's default)."""
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
    teacher_context: Literal["none", "solution"] = "none"
    """solution: the reference (the rl stage's teacher, `self` for on-policy self-distillation) reads
    each prompt with the task's worked solution added (`train/privileged.py`); the student never does."""
    kl_mode: KLMode = "loss"
    """loss (k3 estimator as a loss term, GRPO) | reward (k1 subtracted from the reward, RLHF)."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the entropy bonus (subtracted from the loss, reduced like the policy loss)."""
    dropout: bool = False
    """Keep the model's dropout in the RL update and the reference/value passes. Off by default:
    with dropout the first update is already off-policy (ratio != 1 before any step)."""
    rewards: dict[str, float] = field(default_factory=lambda: {"outcome": 1.0})
    """Reward components and their weights (outcome, format, overlong, process; reward_model: the
    score of `reward_model`; judge: the verdict of `judge`; process_reward_model: the step scores
    of `process_reward_model`). A component of weight 0 is computed and logged, never trained on."""
    reward_model: str | None = None
    """The learned reward model the `reward_model` component scores with: the name of an earlier
    `reward_model` stage (its `<out>/reward_model` folder) or a folder saved by one (relative to the
    recipe), an `AutoModelForSequenceClassification` with one label. The run then also logs
    `reward/gold`, the verifier's reward of every sample, as the gold the proxy is judged by."""
    process_reward_model: str | None = None
    """The process reward model the `process_reward_model` component scores with: the name of an
    earlier `process_reward_model` stage (its `<out>/process_reward_model` folder) or a folder saved
    by one (relative to the recipe). Each sampled completion is cut into steps (`tasks.steps`)
    and every step scored, batched and without gradients; see `process_reward_model_mode`. The run
    then also logs `reward/gold`, the verifier's reward of every sample."""
    process_reward_model_mode: Literal["dense", "min", "product"] = "dense"
    """dense: each step's score is a reward on the token that ends the step (`advantage: gae`
    only, which credits it per token); min / product: the step scores aggregated into one outcome
    score per completion (Lightman et al. 2023), for any estimator."""
    judge: JudgeSpec | None = None
    """The generative judge of the `judge` reward component (`temper.rewards.judge`): {model:
    policy | stage | folder} or {url, model, api_key_env}, with rubric, scale, fallback."""
    path: PathSpec | None = None
    """Verified path rewards (RLVP, `temper.rewards.path`): {beta, rules: [{violation, penalty,
    compliance, reward}], milestones: {signal: weight}}; Phi is z-scored within each group apart
    from the outcome and added as beta x z. null: outcome (and the other components) only."""
    overlong_buffer: Annotated[int, Field(ge=0)] = 0
    """DAPO soft overlong window in tokens before max_new_tokens (0: only truncation is penalized)."""
    dynamic_sampling: bool = False
    max_sampling_rounds: Annotated[int, Field(ge=1)] = 4
    vf_coef: Annotated[float, Field(ge=0)] = 0.5
    """Weight of the value loss (gae); the value loss is always a token mean."""
    value_clip: Annotated[float, Field(ge=0)] = 0.2
    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    turn_gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount across the turns of an episode for turn_grpo / turn_reinforce: the return from turn
    k is sum_{j>=k} turn_gamma^(j-k) step_reward_j + turn_gamma^(last-k) outcome. 1 credits every
    turn with all that follows it; < 1 credits a turn mostly with its own process reward."""
    eval_every: Annotated[int, Field(ge=0)] = 0
    """Steps between greedy evals on the test split (0: none)."""
    eval_problems: Annotated[int, Field(ge=1)] = 64
    save_every: Annotated[int, Field(ge=0)] = 0
    log_rollouts: Annotated[int, Field(ge=0)] = 2
    """Groups per step written to rollouts.jsonl."""
    seed: int = 0
    progress: bool = True
    precision: Precision = "fp32"
    """fp32 | bf16 (autocast over fp32 weights) | auto (bf16 only where it measures faster here);
    training and the hf sampler each decide on their own."""
    trackers: list[Tracker] = field(default_factory=list)
    """Experiment trackers that also get the metrics, e.g. [tensorboard]; metrics.jsonl always."""
    monitors: MonitorConfig = field(default_factory=MonitorConfig)
    """Reward-hacking monitors (`temper.rewards.monitors`): length correlation, train vs gold
    divergence, component trends, violation rate; logged as monitor/<name> and monitor/<name>/flag."""
    user_code: UserCodeConfig = field(default_factory=UserCodeConfig)
    """What the run does when user code (reward functions, env factories and envs, MCP servers,
    judge endpoints) fails or hangs, and when it learns nothing (`temper.train.user_code`):
    {timeout, first_step: stop | count, max_failed_share, zero_variance_steps, on_zero_variance:
    stop | warn}."""
