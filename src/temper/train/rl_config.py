"""Settings of one RL stage: what a recipe's `rl` stage `train:` block holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from temper.algorithms.policy import Aggregation
from temper.precision import Precision
from temper.train.metrics import Tracker
from temper.train.schedule import Schedule

Advantage = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]
"""The names of `temper.algorithms.estimators.ESTIMATORS`."""
KLMode = Literal["loss", "reward"]


@dataclass
class RLConfig:
    """Settings of one RL stage."""

    steps: int = 50
    """RL steps (one rollout batch and its updates each)."""
    prompts_per_step: int = 16
    group_size: int = 8
    """Samples per prompt (G in GRPO)."""
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    advantage: Advantage = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp (outcome, group-relative) | gae (PPO with a value head)."""
    grpo_eps: float = 1e-6
    """epsilon added to the group std by grpo (verl's default; TRL uses 1e-4)."""
    whiten_advantages: bool = True
    """gae: whiten advantages over the batch's completion tokens (verl's default)."""
    epochs: int = 1
    """Optimizer passes over each rollout batch."""
    minibatches: int = 1
    """Optimizer steps per epoch."""
    micro_batch_size: int = 0
    """Sequences per forward pass (packed into rows without padding); 0 = the whole minibatch."""
    lr: float = 1e-4
    warmup_steps: int = 0
    schedule: Schedule = "constant"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_low: float = 0.2
    """PPO clip range below 1 (epsilon_low)."""
    clip_high: float = 0.2
    """PPO clip range above 1 (epsilon_high; DAPO clip-higher uses 0.28)."""
    dual_clip: float | None = 3.0
    """Dual-clip PPO: the loss of a token with negative advantage is capped at dual_clip x |A|
    (verl's clip_ratio_c default 3; null disables). Inactive on the first epoch over fresh samples."""
    aggregation: Aggregation = "token"
    """token (DAPO) | sample (GRPO) | constant (Dr. GRPO: sum / (rows x max_new_tokens))."""
    kl_coef: float = 0.0
    """beta of the KL to the frozen reference; 0 = no reference model."""
    kl_mode: KLMode = "loss"
    """loss (k3 estimator as a loss term, GRPO) | reward (k1 subtracted from the reward, RLHF)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss, reduced like the policy loss)."""
    dropout: bool = False
    """Keep the model's dropout in the RL update and the reference/value passes. Off by default:
    with dropout the first update is already off-policy (ratio != 1 before any step)."""
    rewards: dict[str, float] = field(default_factory=lambda: {"outcome": 1.0})
    """Reward components and their weights (outcome, format, overlong)."""
    overlong_buffer: int = 0
    """DAPO soft overlong window in tokens before max_new_tokens (0: only truncation is penalized)."""
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 4
    vf_coef: float = 0.5
    """Weight of the value loss (gae); the value loss is always a token mean."""
    value_clip: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95
    eval_every: int = 0
    """Steps between greedy evals on the test split (0: none)."""
    eval_problems: int = 64
    save_every: int = 0
    log_rollouts: int = 2
    """Groups per step written to rollouts.jsonl."""
    seed: int = 0
    progress: bool = True
    precision: Precision = "fp32"
    """fp32 | bf16 (autocast over fp32 weights) | auto (bf16 only where it measures faster here);
    training and the hf sampler each decide on their own."""
    trackers: list[Tracker] = field(default_factory=list)
    """Experiment trackers that also get the metrics, e.g. [tensorboard]; metrics.jsonl always."""
