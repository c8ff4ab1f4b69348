"""The RL update's plumbing on hand-computed numbers: temperature fallback, fp32 logprobs, the
soft-capping guard, the one-position vocabulary projection, the config reaching each loss term,
learning rate / dropout / token count / gradient clipping in `update`, the shuffle's independence of
the global RNG, and the data-parallel calls (backward, no_sync, reduce "sum", clip) of one step.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
A toy module stands in for the LM where only the update's arithmetic matters: its per-token logprob is
one parameter `b` (so the ratio is exp(b) against old logprobs 0) and it records the packed rows it reads.
"""

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from temper.models import build_preset
from temper.train.rl_config import RLConfig
from temper.train.rl_update import (
    PolicyWithValue,
    Prepared,
    TokenOutputs,
    _at_least_fp32,
    backward_minibatch,
    last_hidden,
    loss_terms,
    update,
)


class _Toy(torch.nn.Module):
    """logp = b at every completion token, entropy 0, no values; records each packed batch's first tokens."""

    def __init__(self):
        super().__init__()
        self.b = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.seen: list[list[int]] = []

    def forward(self, input_ids_P_W, position_ids_P_W, index_N, targets_N):
        self.seen.append(input_ids_P_W[:, 0].tolist())
        logp_N = self.b.expand(index_N.numel())
        return logp_N, logp_N * 0.0, None


def _prepared(lengths, advantage=1.0, prompts=None) -> Prepared:
    """Rows with prompts [[5, 6], [7], [8, 9, 10], ...] (distinct first tokens) and completions of `lengths`."""
    R, T = len(lengths), max(lengths)
    prompts = prompts or [[5, 6], [7], [8, 9, 10], [11], [12, 13], [14]][:R]
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    completions = torch.full((R, T), 3) * mask
    zeros = torch.zeros(R, T, dtype=torch.float64)
    return Prepared(prompts, completions, mask, zeros, (zeros + advantage) * mask, None, None, None, None)


def _config(**kw) -> RLConfig:
    return RLConfig(**({"advantage": "grpo", "max_new_tokens": 8, "grad_clip": 0.0} | kw))


# ---- PolicyWithValue and the packed forward ------------------------------------------------------


def test_a_temperature_at_or_below_zero_means_one():
    """Greedy sampling (temperature 0) is scored at temperature 1, not by dividing by zero."""
    linear = torch.nn.Linear(2, 2)
    assert PolicyWithValue(linear, None, 0.0).temperature == 1.0
    assert PolicyWithValue(linear, None, -0.5).temperature == 1.0
    assert PolicyWithValue(linear, None, 0.7).temperature == 0.7


def test_logprobs_are_at_least_fp32():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert _at_least_fp32(torch.ones(2, dtype=dtype)).dtype == torch.float32
    assert _at_least_fp32(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


def test_a_soft_capped_model_is_refused():
    model = torch.nn.Linear(2, 2)
    model.config = SimpleNamespace(final_logit_softcapping=30.0)
    ids = torch.zeros((1, 2), dtype=torch.long)
    with pytest.raises(
        ValueError, match="models with soft-capped logits are not supported by the packed RL forward"
    ):
        last_hidden(model, ids, ids, torch.tensor([0]))


def test_the_vocabulary_projection_sees_one_position_per_row(tokenizer):
    """`logits_to_keep=1`: the model's own lm_head runs on (P, 1, H), not on every position."""
    model = build_preset("nano", tokenizer, seed=0)
    shapes = []
    model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: shapes.append(tuple(args[0].shape))
    )
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
    positions = torch.arange(5).repeat(2, 1)
    hidden = last_hidden(model, ids, positions, torch.tensor([1, 7]))
    assert shapes == [(2, 1, model.config.hidden_size)]
    assert hidden.shape == (2, model.config.hidden_size)


# ---- the config reaches each loss term ---------------------------------------------------------


def test_the_policy_term_uses_the_configured_clip_low():
    """A = -1, rho = 0.5: loss = -min(rho A, clip(rho, 1 - 0.1, 1.28) A) = -min(-0.5, -0.9) = 0.9
    (0.8 with the default clip_low 0.2)."""
    config = _config(clip_low=0.1, clip_high=0.28)
    p = _prepared([1], advantage=-1.0)
    out = TokenOutputs(torch.full((1, 1), math.log(0.5), dtype=torch.float64), torch.zeros(1, 1), None)
    per_token, _ = loss_terms(config, p)[0].per_token(out, p, config)
    assert per_token.item() == pytest.approx(0.9, abs=1e-12)


def test_the_value_term_uses_the_configured_value_clip():
    """V = 0.5, V_old = 0, R = 1, clip 0.1: 0.5 max((0.5 - 1)^2, (0.1 - 1)^2) = 0.405 (0.32 with the
    default clip 0.2, 0.125 unclipped); the clipped branch wins: value_clip_frac 1."""
    config = _config(advantage="gae", value_clip=0.1)
    p = _prepared([1])
    p.old_values, p.returns = torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64)
    out = TokenOutputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.full((1, 1), 0.5, dtype=torch.float64))
    value = loss_terms(config, p)[-1]
    per_token, stats = value.per_token(out, p, config)
    assert value.name == "value" and per_token.item() == pytest.approx(0.405, abs=1e-12)
    assert list(stats) == ["value_clip_frac"] and stats["value_clip_frac"].item() == 1.0


# ---- update: lr, dropout, tokens, clipping, shuffle ----------------------------------------------


def test_update_sets_lr_and_eval_mode_and_counts_every_token_read():
    """Rows of prompt + completion lengths 2+1, 1+3, 3+2 read 2, 3, 4 tokens (the last completion token
    is not an input): 9 per epoch with one row per micro-batch, 18 over two epochs."""
    config = _config(epochs=2, micro_batch_size=1)
    module = _Toy().train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    stats, tokens = update(module, optimizer, _prepared([1, 3, 2]), config, step=0, lr=0.1)
    assert tokens == 18
    assert optimizer.param_groups[0]["lr"] == 0.1 and not module.training
    # epoch 1: grad of -mean(A rho) at b = 0 is -1 -> b = 0.1; epoch 2: rho = e^0.1 < 1.28 -> b += 0.1 e^0.1
    assert module.b.item() == pytest.approx(0.1 + 0.1 * math.exp(0.1), abs=1e-12)
    assert stats["loss"] == pytest.approx([-1.0, -math.exp(0.1)], abs=1e-6)  # logged in fp32


def test_update_with_several_minibatches_counts_every_minibatch():
    _, tokens = update(_Toy(), torch.optim.SGD(_Toy().parameters(), lr=0.1), _prepared([1, 3, 2]),
                       _config(minibatches=3), step=0, lr=0.0)  # fmt: skip
    assert tokens == 9


def test_grad_clip_zero_means_no_clipping():
    """A = 2: grad -2, SGD lr 0.1 -> b = 0.2 (clipping at norm 0 would leave b at 0)."""
    module = _Toy()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    stats, _ = update(
        module, optimizer, _prepared([2, 1], advantage=2.0), _config(grad_clip=0.0), step=0, lr=0.1
    )
    assert "grad_norm" not in stats and module.b.item() == pytest.approx(0.2, abs=1e-12)


def test_the_minibatch_shuffle_ignores_the_global_rng():
    """The order is a function of (seed, step, epoch) only: the same under any global seed."""
    orders = []
    for global_seed in (0, 1, 2):
        torch.manual_seed(global_seed)
        module = _Toy()
        update(module, torch.optim.SGD(module.parameters(), lr=0.0), _prepared([1] * 6),
               _config(minibatches=6, epochs=2), step=3, lr=0.0)  # fmt: skip
        orders.append(module.seen)
    assert orders[0] == orders[1] == orders[2]
    assert orders[0][:6] != orders[0][6:]  # epochs differ


def test_a_minibatch_of_one_token_is_divided_by_one():
    stats: dict[str, list[float]] = {}
    config = _config()
    p = _prepared([1])
    backward_minibatch(_Toy(), p, loss_terms(config, p), config, stats)
    assert stats["loss/policy"] == [-1.0]


# ---- the data-parallel calls -------------------------------------------------------------------


class _TwinAccelerator:
    """Accelerate's interface for one of two processes holding identical rows: `reduce` keeps
    accelerate's default reduction "mean" (the identity here) and sums ("sum": twice the tensor);
    `backward` is plain backward (no gradient averaging: the twin's gradient is the same)."""

    num_processes = 2

    def __init__(self):
        self.calls: list = []

    def reduce(self, tensor, reduction="mean"):
        return tensor * 2 if reduction == "sum" else tensor

    def backward(self, loss):
        self.calls.append("backward")
        loss.backward()

    def no_sync(self, module):
        self.calls.append(("no_sync", module))
        return contextlib.nullcontext()

    def clip_grad_norm_(self, params, max_norm):
        self.calls.append("clip")
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def test_a_data_parallel_step_syncs_on_the_last_micro_batch_and_sums_over_processes():
    """Three micro-batches: no_sync around the first two only, backward through the accelerator,
    clip through the accelerator. Sizes and values summed over the two identical processes give the
    one-process numbers: loss -1, and backward of loss x 2 gives the gradient -1 (not -2): b = 0.1."""
    module, accelerator = _Toy(), _TwinAccelerator()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    stats, _ = update(module, optimizer, _prepared([1, 3, 2]), _config(micro_batch_size=1, grad_clip=10.0),
                      step=0, lr=0.1, accelerator=accelerator)  # fmt: skip
    assert accelerator.calls == [
        ("no_sync", module),
        "backward",
        ("no_sync", module),
        "backward",
        "backward",
        "clip",
    ]
    assert stats["loss"] == pytest.approx([-1.0], abs=1e-12) and stats["loss/policy"] == stats["loss"]
    assert stats["grad_norm"] == pytest.approx([1.0], abs=1e-12)
    assert module.b.item() == pytest.approx(0.1, abs=1e-12)
