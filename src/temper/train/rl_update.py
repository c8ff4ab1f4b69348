"""One RL update from a rollout batch: reference logprobs and values (no grad), advantages, then
`epochs` x `minibatches` optimizer steps on a loss that is a sum of named terms.

    loss = sum_k coef_k * (sum over the minibatch of what term k's aggregation averages) / size_k

Each term (policy, entropy, KL, value) has its own aggregation; a micro-batch adds its share of the
numerator and every share is divided by the size of the whole minibatch (`aggregation_size`), so the
summed micro-batch gradients are the full-minibatch gradient for any split. Under data parallelism
the sizes are summed over processes, which makes the same hold across processes.

The model reads the rollouts packed without padding (`rollouts.pack`) and projects onto the
vocabulary only at completion positions. Dropout is off in every pass unless `config.dropout`.

Kept apart from the loop in `temper.train.rl` so that the loop reads top to bottom.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from temper.algorithms.estimators import ESTIMATORS, NEEDS_VALUES, AdvantageInputs
from temper.algorithms.policy import (
    Aggregation,
    aggregation_size,
    entropy_from_logprobs,
    kl_k1,
    kl_k3,
    masked_mean,
    masked_sum,
    policy_loss,
)
from temper.algorithms.value import value_loss
from temper.train.features import BatchExtras
from temper.train.rl_config import RLConfig
from temper.train.rollouts import Packed, RolloutBatch, pack

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = [
    "LossTerm",
    "PolicyWithValue",
    "Prepared",
    "TokenOutputs",
    "ValueHead",
    "backward_minibatch",
    "forward_rows",
    "last_hidden",
    "loss_terms",
    "policy_with_value",
    "prepare",
    "same_rows_everywhere",
    "set_dropout",
    "update",
]


class ValueHead(torch.nn.Module):
    """V(s_t) from the policy's last hidden state (a shared trunk, as in the original PPO-for-LMs
    setups; cheaper than a second model at our sizes)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden_N_H: torch.Tensor) -> torch.Tensor:
        return self.proj(_at_least_fp32(hidden_N_H)).squeeze(-1)


class PolicyWithValue(torch.nn.Module):
    """The one module an RL update differentiates: a causal LM (plain or PEFT-wrapped) and, for
    PPO, a value head on its last hidden state. Data-parallel training wraps exactly this module.

    forward(packed rows) -> per completion token (N,): logprob at `temperature`, entropy (always
    differentiable: a detached entropy is how an entropy bonus silently does nothing), value or None.
    The decoder runs over the packed rows; the output embedding is applied to the N selected hidden
    states only, not to every position (the (P, W, V) logits are the largest tensor of a step).
    """

    def __init__(self, policy: torch.nn.Module, value: ValueHead | None = None, temperature: float = 1.0):
        super().__init__()
        self.policy = policy  # attribute names are the checkpoint's keys: "policy", "value"
        self.value = value
        self.temperature = temperature if temperature > 0 else 1.0

    def forward(
        self,
        input_ids_P_W: torch.Tensor,
        position_ids_P_W: torch.Tensor,
        index_N: torch.Tensor,
        targets_N: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        hidden_N_H = last_hidden(self.policy, input_ids_P_W, position_ids_P_W, index_N)
        logits_N_V = self.policy.get_output_embeddings()(hidden_N_H) / self.temperature
        logp_N_V = torch.log_softmax(_at_least_fp32(logits_N_V), dim=-1)
        logp_N = logp_N_V.gather(-1, targets_N[:, None]).squeeze(-1)
        values_N = self.value(hidden_N_H) if self.value is not None else None
        return logp_N, entropy_from_logprobs(logp_N_V), values_N


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Logprobs, entropies and values in fp32 (bf16 logits lose the small differences the ratio
    needs), or in fp64 for a fp64 model (the exactness tests)."""
    return x if x.dtype == torch.float64 else x.float()


def last_hidden(
    model: torch.nn.Module, input_ids_P_W: torch.Tensor, position_ids_P_W: torch.Tensor, index_N: torch.Tensor
) -> torch.Tensor:
    """The final (normed) hidden state at `index_N` (flat over P x W) -> (N, H).

    Called through the model's own forward, so PEFT adapters and wrappers such as the stage's
    adapter-disabled reference apply; `logits_to_keep=1` keeps it from projecting every position.
    No attention mask: transformers reads packed sequences from the restarting `position_ids`.
    """
    if getattr(getattr(model, "config", None), "final_logit_softcapping", None):
        raise ValueError("models with soft-capped logits are not supported by the packed RL forward")
    out = model(
        input_ids=input_ids_P_W,
        position_ids=position_ids_P_W,
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    return out.hidden_states[-1].flatten(0, 1)[index_N]


def policy_with_value(model: torch.nn.Module, config: RLConfig) -> PolicyWithValue:
    """The trainable module for `config`: a zero-initialized value head when the estimator needs values."""
    value = None
    if config.advantage in NEEDS_VALUES:
        weight = next(model.parameters())
        # in the dtype `_at_least_fp32` hands it: fp32, or fp64 for a fp64 model
        dtype = torch.promote_types(weight.dtype, torch.float32)
        value = ValueHead(model.config.hidden_size).to(weight.device, dtype)
    return PolicyWithValue(model, value, config.temperature)


def set_dropout(config: RLConfig, *modules: torch.nn.Module | None) -> None:
    """The one train/eval switch of RL: eval mode (no dropout) unless `config.dropout`, so the
    first update of fresh samples is exactly on-policy (ratio 1) even for a model with dropout."""
    for module in modules:
        if module is not None:
            module.train(config.dropout)


@dataclass
class Prepared:
    """One rollout batch on the device with everything the update needs. Per-token tensors are
    (R, T) over completion tokens (see `RolloutBatch`)."""

    prompts: list[list[int]]
    completions: torch.Tensor
    mask: torch.Tensor
    old_logp: torch.Tensor  # the sampler's logprobs: the importance-ratio denominator
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None
    ref_kl: torch.Tensor | None  # k1 of the sampled tokens against the reference
    old_values: torch.Tensor | None
    returns: torch.Tensor | None
    is_weights: torch.Tensor | None = None
    """The mismatch correction's per-token weights (then `old_logp` is the trainer's at sampling
    time, not the sampler's: the decoupled ratio), or None."""
    mismatch: dict[str, float] = field(default_factory=dict)
    """The step's `mismatch/...` diagnostics (this process's rows)."""
    deferred: Any = None
    """The diagnostics-only `Correction` when `prepare` left the mismatch to the update's first
    forward (`diagnose_in_update`), or None."""

    def rows(self, idx: torch.Tensor) -> Prepared:
        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx]

        return Prepared(
            [self.prompts[i] for i in idx.tolist()],
            *(take(t) for t in (self.completions, self.mask, self.old_logp, self.advantages)),
            *(take(t) for t in (self.ref_logp, self.ref_kl, self.old_values, self.returns)),
            take(self.is_weights),
        )

    def packed(self) -> Packed:
        return pack(self.prompts, self.completions, self.mask)


@dataclass
class TokenOutputs:
    """The module's outputs for the rows of a `Prepared`, scattered back to (B, T)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None


def forward_rows(module: torch.nn.Module, p: Prepared) -> tuple[TokenOutputs, int]:
    """Forward `p`'s rows packed; -> (per-token outputs (B, T), tokens the model read)."""
    packed = p.packed()
    logp_N, entropy_N, values_N = module(
        packed.input_ids_P_W, packed.position_ids_P_W, packed.index_N, packed.targets_N
    )

    def to_B_T(x_N: torch.Tensor | None) -> torch.Tensor | None:
        return None if x_N is None else x_N.new_zeros(p.mask.shape).masked_scatter(p.mask, x_N)

    return TokenOutputs(to_B_T(logp_N), to_B_T(entropy_N), to_B_T(values_N)), packed.input_ids_P_W.numel()


def diagnose_in_update(config: RLConfig, correction: Any) -> bool:
    """Whether the mismatch diagnostics can read the trainer's logprobs from the update's first
    forward instead of a no-grad pass of their own: only the diagnostics (no weights, which the
    loss needs before its first forward), one epoch of one minibatch (whose forward is over all
    rows, in `prepare`'s order and micro-batches, at the sampling weights: the same numbers) and
    no dropout (the update's forward would draw it; the sampler ran without). PPO's value pass
    computes the logprobs anyway. Saves one forward per step (5-15% of the demo's RL stage)."""
    return (
        correction is not None
        and not correction.corrects
        and config.epochs == 1
        and config.minibatches == 1
        and not config.dropout
        and config.advantage not in NEEDS_VALUES
    )


@torch.no_grad()
def prepare(
    batch: RolloutBatch,
    module: torch.nn.Module,
    reference: torch.nn.Module | None,
    config: RLConfig,
    accelerator: Accelerator | None = None,
    extras: BatchExtras | None = None,
) -> Prepared:
    """Tensors on the module's device, reference logprobs and old values (micro-batched, no grad),
    advantages from the configured estimator. `extras`: what the run's features add (the
    estimator's named inputs; the prompts the reference reads instead of the rows' own).

    Under data parallelism each process prepares its own rows, whole groups: the group estimators
    need nothing else, and the batch-wide statistics (GAE whitening, reinforce_pp's normalization)
    are summed over processes through `accelerator`, so every process gets the one-process advantages.
    """
    same_rows_everywhere(len(batch.prompts), config, accelerator)  # before the forwards below
    device = next(module.parameters()).device
    batch = batch.to(device)
    extras = extras or BatchExtras()
    if extras.reference_prompts is not None and len(extras.reference_prompts) != len(batch.prompts):
        raise ValueError(
            f"the reference's prompts are per episode ({len(extras.reference_prompts)}) and the "
            f"batch has {len(batch.prompts)} rows (an agent rewrote its history): not supported"
        )
    p = Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, batch.old_logprobs_R_T, *[None] * 5)
    needs_values = config.advantage in NEEDS_VALUES
    ref_module = PolicyWithValue(reference, None, config.temperature) if reference is not None else None
    set_dropout(config, module, ref_module)
    correction = extras.correction
    if diagnose_in_update(config, correction):
        p.deferred, correction = correction, None
    ref_parts, value_parts, logp_parts = [], [], []
    for rows in torch.arange(len(p.prompts)).split(config.micro_batch_size or len(p.prompts)):
        if ref_module is not None and config.kl_coef > 0:
            ref_rows = p.rows(rows)
            if extras.reference_prompts is not None:  # OPSD: the same completions after the teacher's prompt
                ref_rows.prompts = [extras.reference_prompts[i] for i in rows.tolist()]
            ref_parts.append(forward_rows(ref_module, ref_rows)[0].logp)
        # one pass for the values and the trainer's logprobs, unless dropout is on: the sampler ran
        # without it, so the logprobs compared with its own are taken in eval mode (no RNG drawn)
        if needs_values:
            out = forward_rows(module, p.rows(rows))[0]
            value_parts.append(out.values)
        if correction is not None:
            if config.dropout:
                module.eval()
                out = forward_rows(module, p.rows(rows))[0]
                set_dropout(config, module)
            elif not needs_values:
                out = forward_rows(module, p.rows(rows))[0]
            logp_parts.append(out.logp)
    if correction is not None:  # the trainer's logprobs at the sampling weights vs the sampler's
        trainer_logp = torch.cat(logp_parts)
        p.is_weights, p.mismatch = correction(trainer_logp, p.old_logp, p.mask)
        if p.is_weights is not None:  # decoupled: the PPO ratio against the trainer, the weights for the rest
            p.old_logp = trainer_logp
    if ref_parts:
        p.ref_logp = torch.cat(ref_parts)
        p.ref_kl = kl_k1(p.old_logp, p.ref_logp) * p.mask
    if needs_values:
        p.old_values = torch.cat(value_parts)
    inputs = AdvantageInputs(
        rewards_G_N=batch.rewards_G_N,
        mask_R_T=p.mask,
        values_R_T=p.old_values,
        ref_kl_R_T=p.ref_kl,
        kl_coef=config.kl_coef if config.kl_mode == "reward" else 0.0,
        gamma=config.gamma,
        lam=config.lam,
        turn_gamma=config.turn_gamma,
        turn_R_T=batch.turn_R_T,
        step_rewards_R_K=batch.step_rewards_R_K,
        turns_R=batch.turns_R,
        token_rewards_R_T=batch.token_rewards_R_T,
        whiten=config.whiten_advantages,
        grpo_eps=config.grpo_eps,
        total=lambda t: _sum_over_processes(t, accelerator),
        extra={k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in extras.inputs.items()},
        episode_R=batch.episode_R,
    )
    p.advantages, p.returns = ESTIMATORS[config.advantage](inputs)
    return p


# ---- the loss: a list of named terms ---------------------------------------------------------

PerToken = Callable[[TokenOutputs, Prepared, RLConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class LossTerm:
    """coef x (per-token loss reduced by `aggregation`); logged as loss/<name> (without coef)."""

    name: str
    coef: float
    aggregation: Aggregation
    per_token: PerToken


def _policy(out: TokenOutputs, p: Prepared, config: RLConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss, stats = policy_loss(
        out.logp,
        p.old_logp,
        p.advantages,
        p.mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        dual_clip=config.dual_clip,
    )
    if p.is_weights is not None:  # the mismatch correction: TRL's per_token_loss * importance_sampling_ratio
        loss = loss * p.is_weights
    return loss, stats


def _entropy(
    out: TokenOutputs, p: Prepared, config: RLConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return out.entropy, {}


def _kl(out: TokenOutputs, p: Prepared, config: RLConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    k3 = kl_k3(out.logp, p.ref_logp)
    return k3, {"kl": masked_mean(k3.detach(), p.mask)}


def _value(out: TokenOutputs, p: Prepared, config: RLConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss, stats = value_loss(out.values, p.old_values, p.returns, p.mask, clip=config.value_clip)
    return loss, {"value_clip_frac": stats["clip_frac"]}


def loss_terms(config: RLConfig, p: Prepared) -> list[LossTerm]:
    """The terms of this config's loss, in the order they are logged.

    Entropy and KL are reduced like the policy loss, as verl does (agg_loss with the actor's
    loss_agg_mode); TRL 1.16 also adds its KL per token before aggregating, but always takes a token
    mean for the entropy bonus (the same under aggregation "token"). The value loss is always a token
    mean (verl's critic default: a token's weight in fitting V should not depend on its sequence's
    length). The KL term is k3 without TRL's default importance-ratio correction (GRPO eq. 4, verl).
    """
    terms = [LossTerm("policy", 1.0, config.aggregation, _policy)]
    if config.entropy_coef:
        terms.append(LossTerm("entropy", -config.entropy_coef, config.aggregation, _entropy))
    if p.ref_logp is not None and config.kl_mode == "loss" and config.kl_coef:
        terms.append(LossTerm("kl", config.kl_coef, config.aggregation, _kl))
    if p.returns is not None:
        terms.append(LossTerm("value", config.vf_coef, "token", _value))
    return terms


def update(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    p: Prepared,
    config: RLConfig,
    step: int,
    lr: float,
    accelerator: Accelerator | None = None,
) -> tuple[dict[str, list[float]], int]:
    """`epochs` passes of `minibatches` optimizer steps over the batch; -> (stats lists, tokens).

    `module` is a `PolicyWithValue`, or the same wrapped by `accelerator.prepare` (DDP). With an
    accelerator of W > 1 processes, `p` holds this process's rows (see `backward_minibatch`).
    """
    same_rows_everywhere(len(p.prompts), config, accelerator)
    terms = loss_terms(config, p)
    params = [q for q in module.parameters() if q.requires_grad]
    set_dropout(config, module)
    for group in optimizer.param_groups:
        group["lr"] = lr
    stats: dict[str, list[float]] = {}
    tokens = 0
    R = len(p.prompts)
    for epoch in range(config.epochs):
        order = torch.randperm(
            R, generator=torch.Generator().manual_seed(config.seed * 7 + step * 1000 + epoch)
        )
        for mb in order.chunk(config.minibatches):
            # sorted: the packing (hence every rounding) depends only on which rows are in the minibatch,
            # so a first epoch over one minibatch reproduces `prepare`'s numbers exactly (ratio == 1)
            logp_parts: list[torch.Tensor] | None = [] if p.deferred is not None else None
            tokens += backward_minibatch(
                module, p.rows(mb.sort().values), terms, config, stats, accelerator, logp_parts
            )
            if logp_parts is not None:  # one minibatch of every row: the trainer's logprobs at sampling time
                _, p.mismatch = p.deferred(torch.cat(logp_parts), p.old_logp, p.mask)
                p.deferred = None
            if config.grad_clip > 0:
                clip = (
                    accelerator.clip_grad_norm_ if accelerator is not None else torch.nn.utils.clip_grad_norm_
                )
                _add(stats, "grad_norm", clip(params, config.grad_clip))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return stats, tokens


def same_rows_everywhere(rows: int, config: RLConfig, accelerator: Accelerator | None) -> None:
    """Under W > 1 processes with several minibatches, every process must split the same number
    of rows (`torch.chunk` of unequal counts can give a different number of optimizer steps,
    whose gradient syncs would not pair up: the collectives hang). Equal groups give equal rows,
    unless an agent rewrote its history (an episode of several rows, `train/rollouts.to_batch`):
    that stops the run with one line. Micro-batches of unequal counts pair up under DDP (it syncs
    once, on each process's last), not under fsdp, where every forward gathers the shards."""
    import torch

    fsdp = config.strategy == "fsdp"
    if accelerator is None or accelerator.num_processes == 1 or (config.minibatches == 1 and not fsdp):
        return
    counts = accelerator.gather(torch.tensor([rows], device=accelerator.device)).tolist()
    if min(counts) != max(counts):
        why, fix = (
            ("under strategy fsdp (every forward is a collective)", "strategy ddp with minibatches 1")
            if fsdp
            else ("with minibatches > 1", "minibatches 1")
        )
        raise ValueError(
            f"the processes hold {counts} batch rows (an agent rewrote its history: an episode of "
            f"several rows), and {why} they must match: train such an agent with {fix}, or in one process"
        )


def backward_minibatch(
    module: torch.nn.Module,
    p: Prepared,
    terms: list[LossTerm],
    config: RLConfig,
    stats: dict[str, list[float]],
    accelerator: Accelerator | None = None,
    logp_parts: list[torch.Tensor] | None = None,
) -> int:
    """Accumulate the gradient of one minibatch's loss, micro-batch by micro-batch; -> tokens read.
    `logp_parts`, if given, receives each micro-batch's detached logprobs (R_micro, T).

    Each term adds masked_sum(micro-batch) / size(whole minibatch), so the micro-batch gradients
    sum to the minibatch's. With W > 1 processes, `p` holds this process's rows: the sizes are
    summed over processes and each backward is of loss x W (DDP averages gradients over the W
    processes), without gradient sync until the last micro-batch. Every process must then run the
    same number of micro-batches (DDP syncs on the last one): give each process the same row count.
    """
    W = accelerator.num_processes if accelerator is not None else 1
    device = p.mask.device
    sizes = {  # clamped as in masked_mean: a minibatch without completion tokens adds 0, not NaN
        agg: _sum_over_processes(aggregation_size(p.mask, agg, config.max_new_tokens), accelerator).clamp_min(
            1
        )
        for agg in {t.aggregation for t in terms}
    }
    values = torch.zeros(len(terms), device=device)  # each term's minibatch value, for the log
    tokens = 0
    micro = torch.arange(len(p.prompts), device="cpu").split(config.micro_batch_size or len(p.prompts))
    for i, rows in enumerate(micro):
        last = i == len(micro) - 1
        with contextlib.nullcontext() if accelerator is None or last else accelerator.no_sync(module):
            chunk = p.rows(rows)
            out, n = forward_rows(module, chunk)
            if logp_parts is not None:
                logp_parts.append(out.logp.detach())
            loss = torch.zeros((), device=device)
            for k, term in enumerate(terms):
                per_token, term_stats = term.per_token(out, chunk, config)
                part = masked_sum(per_token, chunk.mask, term.aggregation) / sizes[term.aggregation]
                loss = loss + term.coef * part
                values[k] += part.detach()
                for key, v in term_stats.items():
                    _add(stats, key, v)
            _add(stats, "entropy", masked_mean(out.entropy.detach(), chunk.mask))
            if accelerator is not None:
                accelerator.backward(loss * W)
            else:
                loss.backward()
            tokens += n
    values = _sum_over_processes(values, accelerator)
    for term, v in zip(terms, values.tolist()):
        _add(stats, f"loss/{term.name}", v)
    _add(stats, "loss", sum(t.coef * v for t, v in zip(terms, values.tolist())))
    return tokens


def _sum_over_processes(t: torch.Tensor, accelerator: Accelerator | None) -> torch.Tensor:
    if accelerator is None or accelerator.num_processes == 1:
        return t
    return accelerator.reduce(t, "sum")


def _add(stats: dict[str, list[float]], key: str, value: torch.Tensor | float) -> None:
    stats.setdefault(key, []).append(
        float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
    )


class AdapterDisabled(torch.nn.Module):
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
