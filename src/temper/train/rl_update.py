"""One RL update from a rollout batch: tensors on the device, reference logprobs and values,
advantages, then `epochs` x `minibatches` optimizer steps over the policy (and value) loss.

Kept apart from the loop in `temper.train.rl` so that the loop reads top to bottom.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from temper.algorithms.advantages import ADVANTAGES
from temper.algorithms.losses import token_logprobs
from temper.algorithms.policy import (
    entropy_from_logits,
    kl_k1,
    kl_k3,
    kl_penalized_rewards,
    masked_mean,
    policy_loss,
)
from temper.algorithms.value import gae, value_loss
from temper.train.rl_config import RLConfig
from temper.train.rollouts import RolloutBatch


class ValueHead(torch.nn.Module):
    """V(s_t) from the policy's last hidden state (a shared trunk, as in the original PPO-for-LMs
    setups; cheaper than a second model at our sizes)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden_B_T_H: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden_B_T_H.float()).squeeze(-1)


def forward(
    model,
    batch_ids: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    value_head: ValueHead | None = None,
):
    """(token logprobs at temperature, entropy, values or None), all (R, L)."""
    out = model(input_ids=batch_ids, use_cache=False, output_hidden_states=value_head is not None)
    logits = out.logits / (temperature if temperature > 0 else 1.0)
    logp = token_logprobs(logits, targets)
    entropy = entropy_from_logits(logits.detach())
    values = value_head(out.hidden_states[-1]) if value_head is not None else None
    return logp, entropy, values


def compute_advantages(
    batch: RolloutBatch, config: RLConfig, ref_kl: torch.Tensor | None, values: torch.Tensor | None
):
    """Per-token advantages (R, L) and, for PPO, returns (R, L)."""
    rewards = batch.rewards_G_N
    if config.advantage == "gae":
        beta = config.kl_coef if config.kl_mode == "reward" and ref_kl is not None else 0.0
        kl = ref_kl if ref_kl is not None else torch.zeros_like(batch.old_logprobs)
        token_rewards = kl_penalized_rewards(rewards.reshape(-1), kl, batch.mask, beta)
        return gae(token_rewards, values, batch.mask, config.gamma, config.lam)
    if config.kl_mode == "reward" and ref_kl is not None and config.kl_coef > 0:
        # sequence-level RLHF penalty: r - beta * sum_t k1_t, before the group baseline
        rewards = rewards - config.kl_coef * (ref_kl * batch.mask).sum(-1).reshape(rewards.shape)
    if config.advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage {config.advantage!r}; valid: {', '.join(ADVANTAGES)}, gae")
    per_sample = ADVANTAGES[config.advantage](rewards).reshape(-1, 1)  # (R, 1)
    return per_sample.expand_as(batch.old_logprobs) * batch.mask, None


def _share(mask_mb: torch.Tensor, mask_all: torch.Tensor, aggregation: str) -> float:
    """Weight of a micro-batch's loss so that micro-batches add up to the minibatch's loss."""
    if aggregation == "token":
        return mask_mb.sum().item() / max(mask_all.sum().item(), 1)
    return mask_mb.shape[0] / mask_all.shape[0]


@dataclass
class Prepared:
    """One rollout batch on the device, with everything the update needs. All (R, L)."""

    ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None
    ref_kl: torch.Tensor | None  # k1 of the sampled tokens against the reference
    old_values: torch.Tensor | None
    returns: torch.Tensor | None


@torch.no_grad()
def prepare(batch: RolloutBatch, model, reference, value_head, config: RLConfig, device) -> Prepared:
    batch = _on(batch, device)
    ref_logp = None
    if reference is not None and config.kl_coef > 0:
        ref_logp = forward(reference, batch.input_ids, batch.targets, config.temperature)[0]
    old_values = None
    if value_head is not None:
        old_values = forward(model, batch.input_ids, batch.targets, config.temperature, value_head)[2]
    ref_kl = kl_k1(batch.old_logprobs, ref_logp) if ref_logp is not None else None
    advantages, returns = compute_advantages(batch, config, ref_kl, old_values)
    return Prepared(
        batch.input_ids,
        batch.targets,
        batch.mask,
        batch.old_logprobs,
        advantages,
        ref_logp,
        ref_kl,
        old_values,
        returns,
    )


def update(model, value_head, optimizer, params, p: Prepared, config: RLConfig, step: int, lr: float):
    """`epochs` passes of `minibatches` optimizer steps over the batch; -> (stats lists, tokens)."""
    model.train()
    for group in optimizer.param_groups:
        group["lr"] = lr
    stats: dict[str, list[float]] = {}
    tokens = 0
    R = p.ids.shape[0]
    for epoch in range(config.epochs):
        order = torch.randperm(
            R, generator=torch.Generator().manual_seed(config.seed * 7 + step * 1000 + epoch)
        )
        for mb in order.chunk(config.minibatches):
            for chunk in mb.split(config.micro_batch_size or len(mb)):
                m = p.mask[chunk]
                logp, entropy, values = forward(
                    model, p.ids[chunk], p.targets[chunk], config.temperature, value_head
                )
                loss, pstats = policy_loss(
                    logp,
                    p.old_logp[chunk],
                    p.advantages[chunk],
                    m,
                    clip_low=config.clip_low,
                    clip_high=config.clip_high,
                    aggregation=config.aggregation,
                    max_tokens=config.max_new_tokens,
                )
                ent = masked_mean(entropy, m)
                total = loss - config.entropy_coef * ent
                if p.ref_logp is not None and config.kl_mode == "loss":
                    kl = masked_mean(
                        kl_k3(logp, p.ref_logp[chunk]), m, config.aggregation, config.max_new_tokens
                    )
                    total = total + config.kl_coef * kl
                    _add(stats, "kl", kl)
                if value_head is not None:
                    vloss, vstats = value_loss(
                        values, p.old_values[chunk], p.returns[chunk], m, clip=config.value_clip
                    )
                    total = total + config.vf_coef * vloss
                    _add(stats, "value_loss", vloss)
                    _add(stats, "value_clip_frac", vstats["clip_frac"])
                (total * _share(m, p.mask[mb], config.aggregation)).backward()
                tokens += int(p.ids[chunk].numel())
                for k, v in {"policy_loss": loss, "entropy": ent, **pstats}.items():
                    _add(stats, k, v)
            if config.grad_clip > 0:
                _add(stats, "grad_norm", torch.nn.utils.clip_grad_norm_(params, config.grad_clip))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return stats, tokens


def _on(batch: RolloutBatch, device: torch.device) -> RolloutBatch:
    return RolloutBatch(
        *(
            t.to(device)
            for t in (
                batch.input_ids,
                batch.targets,
                batch.mask,
                batch.old_logprobs,
                batch.rewards_G_N,
                batch.lengths,
            )
        )
    )


def _add(stats: dict[str, list[float]], key: str, value: torch.Tensor | float) -> None:
    stats.setdefault(key, []).append(
        float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
    )
