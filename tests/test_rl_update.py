"""The RL update against references on identical tensors: micro-batching never changes a gradient
(every aggregation x every loss term), the packed forward equals a padded full-logits forward, the
entropy bonus reaches the gradient, dropout is off in RL passes, and the data-parallel contract
(sizes summed over processes, backward of loss x W, DDP's mean) gives the one-process gradient."""

import contextlib
import math
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from temper.models import apply_lora, build_preset
from temper.train.rl_config import RLConfig
from temper.train.rl_update import (
    LossTerm,
    PolicyWithValue,
    Prepared,
    TokenOutputs,
    _at_least_fp32,
    backward_minibatch,
    forward_rows,
    last_hidden,
    loss_terms,
    policy_with_value,
    prepare,
    update,
)
from temper.train.rollouts import RolloutBatch, pack

AGGREGATIONS = ["token", "sample", "constant"]
TERMS = ["policy", "entropy", "kl", "value"]
MAX_NEW_TOKENS = 8


def _rollouts(G=3, N=3, seed=0, vocab=263) -> RolloutBatch:
    """Ragged prompts and completions (one of a single token), rewards with variance in every group."""
    g = torch.Generator().manual_seed(seed)
    R = G * N
    prompts = [
        torch.randint(3, vocab, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(R)
    ]
    lengths = torch.randint(1, MAX_NEW_TOKENS + 1, (R,), generator=g)
    lengths[1] = 1
    T = int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]
    completions = torch.randint(3, vocab, (R, T), generator=g) * mask
    rewards = torch.rand(G, N, generator=g).round()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    return RolloutBatch(prompts, completions, mask, torch.zeros(R, T), rewards)


def _off_policy(module, batch: RolloutBatch, seed=1, noise=0.5) -> RolloutBatch:
    """The batch with "sampler" logprobs = teacher-forced logprobs + noise, so ratios spread around 1
    and both PPO clips and the dual clip are active."""
    with torch.no_grad():
        logp = forward_rows(
            module, Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, *[None] * 6)
        )[0].logp
    g = torch.Generator().manual_seed(seed)
    old = (logp + noise * torch.randn(logp.shape, generator=g, dtype=logp.dtype)) * batch.mask_R_T
    return replace(batch, old_logprobs_R_T=old)


def _config(**kw) -> RLConfig:
    base = dict(
        advantage="gae",
        temperature=0.7,
        max_new_tokens=MAX_NEW_TOKENS,
        entropy_coef=0.1,
        kl_coef=0.2,
        vf_coef=0.5,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=1.5,  # low, so that some tokens of these random batches hit it
        value_clip=0.05,
        lam=0.9,
    )
    return RLConfig(**(base | kw))


def _setup(tokenizer, config: RLConfig, dtype=torch.float64, seed=0):
    """A policy with a random value head, a different reference, a prepared off-policy batch."""
    torch.manual_seed(seed)
    module = policy_with_value(build_preset("nano", tokenizer, seed=1), config).to(dtype)
    if module.value is not None:
        torch.nn.init.normal_(module.value.proj.weight, std=0.3)
    reference = build_preset("nano", tokenizer, seed=2).to(dtype).requires_grad_(False)
    batch = _off_policy(module, _rollouts(vocab=len(tokenizer)))
    p = prepare(batch, module, reference, config)
    return module, p


def _grads(module) -> torch.Tensor:
    return torch.cat(
        [(q.grad if q.grad is not None else torch.zeros_like(q)).flatten() for q in module.parameters()]
    )


def _gradient(module, p, terms, config, accelerator=None) -> tuple[torch.Tensor, dict]:
    module.zero_grad(set_to_none=True)
    stats: dict[str, list[float]] = {}
    backward_minibatch(module, p, terms, config, stats, accelerator)
    return _grads(module), stats


# ---- micro-batching never changes a gradient ----------------------------------------------------


@pytest.mark.parametrize("term", TERMS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_sum_to_the_full_batch_gradient(tokenizer, aggregation, term):
    config = _config(aggregation=aggregation)
    module, p = _setup(tokenizer, config)
    (only,) = [t for t in loss_terms(config, p) if t.name == term]
    full, _ = _gradient(module, p, [only], config)
    assert full.abs().max() > 1e-5  # the term has a gradient to compare
    for micro in (1, 2, 4):
        split, _ = _gradient(module, p, [only], replace(config, micro_batch_size=micro))
        torch.testing.assert_close(split, full, rtol=1e-10, atol=1e-12)


def test_the_value_term_is_a_token_mean_whatever_the_policy_aggregation(tokenizer):
    # The defect this replaces: every micro-batch was weighted by its share of rows under "sample",
    # while the value loss inside it was a token mean, so micro-batches did not add up.
    for aggregation in AGGREGATIONS:
        terms = {
            t.name: t for t in loss_terms(_config(aggregation=aggregation), _setup(tokenizer, _config())[1])
        }
        assert terms["value"].aggregation == "token"
        assert (
            terms["policy"].aggregation
            == terms["entropy"].aggregation
            == terms["kl"].aggregation
            == aggregation
        )


# ---- the whole loss against a padded, full-logits reference -------------------------------------


def _padded_reference(module, p: Prepared, config: RLConfig) -> torch.Tensor:
    """The loss computed the plain way: right-padded (R, L) rows, logits at every position, each term
    reduced by its formula (verl's agg_loss modes token-mean / seq-mean-token-mean /
    seq-mean-token-sum-norm), value loss a token mean."""
    R, T = p.mask.shape
    seqs = [pr + c[:n] for pr, c, n in zip(p.prompts, p.completions.tolist(), p.mask.sum(-1).tolist())]
    L = max(len(s) for s in seqs)
    ids = torch.zeros(R, L, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
    out = module.policy(input_ids=ids, output_hidden_states=True)
    logits = out.logits / config.temperature
    pos = torch.tensor([len(pr) - 1 for pr in p.prompts])[:, None] + torch.arange(T)[None, :]
    pos = pos.clamp_max(L - 1)
    logits_R_T_V = logits.gather(1, pos[..., None].expand(R, T, logits.shape[-1]))
    logp_all = torch.log_softmax(logits_R_T_V, -1)
    logp = logp_all.gather(-1, p.completions[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    hidden = out.hidden_states[-1].gather(1, pos[..., None].expand(R, T, out.hidden_states[-1].shape[-1]))
    values = module.value(hidden)
    m = p.mask.to(logp.dtype)

    def agg(x, mode):
        if mode == "token":
            return (x * m).sum() / m.sum()
        if mode == "sample":
            return ((x * m).sum(-1) / m.sum(-1)).mean()
        return (x * m).sum() / (R * config.max_new_tokens)

    # policy: verl core_algos.compute_policy_loss_vanilla (clip-higher + dual clip), inline
    ratio = torch.exp(logp - p.old_logp)
    A = p.advantages
    l1, l2 = -A * ratio, -A * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    clip1 = torch.maximum(l1, l2)
    pg = torch.where(A < 0, torch.minimum(-A * config.dual_clip, clip1), clip1)
    kl = torch.exp(p.ref_logp - logp) - (p.ref_logp - logp) - 1
    v_clipped = values.clamp(p.old_values - config.value_clip, p.old_values + config.value_clip)
    vf = 0.5 * torch.maximum((values - p.returns) ** 2, (v_clipped - p.returns) ** 2)
    a = config.aggregation
    return (
        agg(pg, a)
        - config.entropy_coef * agg(entropy, a)
        + config.kl_coef * agg(kl, a)
        + config.vf_coef * agg(vf, "token")
    )


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_packed_micro_batched_loss_and_gradient_equal_the_padded_reference(tokenizer, aggregation):
    config = _config(aggregation=aggregation, micro_batch_size=2)
    module, p = _setup(tokenizer, config, dtype=torch.float32)
    terms = loss_terms(config, p)
    assert [t.name for t in terms] == TERMS
    packed, stats = _gradient(module, p, terms, config)
    module.zero_grad(set_to_none=True)
    reference = _padded_reference(module, p, config)
    reference.backward()
    assert stats["loss"][0] == pytest.approx(reference.item(), abs=1e-5)
    torch.testing.assert_close(packed, _grads(module), rtol=0, atol=1e-5)


def test_entropy_bonus_changes_the_update(tokenizer):
    config = _config(advantage="grpo", kl_coef=0.0)
    module, p = _setup(tokenizer, config)
    with_bonus, _ = _gradient(module, p, loss_terms(config, p), config)
    without, _ = _gradient(module, p, loss_terms(replace(config, entropy_coef=0.0), p), config)
    assert (with_bonus - without).abs().max() > 1e-4
    # and by -coef x the gradient of the mean entropy (to the fp32 rounding of Llama's RMSNorm)
    (entropy,) = [t for t in loss_terms(config, p) if t.name == "entropy"]
    only_entropy, _ = _gradient(module, p, [replace(entropy, coef=1.0)], config)
    torch.testing.assert_close(
        with_bonus - without, -config.entropy_coef * only_entropy, rtol=1e-4, atol=1e-7
    )


def test_loss_terms_follow_the_config(tokenizer):
    config = _config()
    _, p = _setup(tokenizer, config)
    names = lambda c: [t.name for t in loss_terms(c, p)]  # noqa: E731
    assert names(config) == TERMS
    assert names(replace(config, entropy_coef=0.0)) == ["policy", "kl", "value"]
    assert names(replace(config, kl_mode="reward")) == ["policy", "entropy", "value"]
    no_ref = replace(p, ref_logp=None, returns=None)
    assert [t.name for t in loss_terms(config, no_ref)] == ["policy", "entropy"]
    assert all(isinstance(t, LossTerm) for t in loss_terms(config, p))


# ---- packing --------------------------------------------------------------------------------------


def _gpt2(tokenizer, **kw):
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64, **kw)
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def _llama_with_dropout(tokenizer):
    from temper.models.presets import preset_config

    config: LlamaConfig = preset_config("nano", tokenizer)
    config.attention_dropout = 0.1
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _lora(tokenizer, target_modules="all-linear"):
    model = apply_lora(build_preset("nano", tokenizer, seed=0), r=4, alpha=8, target_modules=target_modules)
    for name, q in model.named_parameters():  # a nonzero adapter, so that running without it would differ
        if "lora_B" in name:
            torch.nn.init.normal_(q, std=0.1)
    return model


@pytest.mark.parametrize("arch", ["llama", "gpt2", "llama-lora", "llama-lora-on-lm_head"])
def test_a_packed_row_gives_each_sequence_its_own_logprobs(tokenizer, arch):
    model = {
        "gpt2": _gpt2,
        "llama": lambda t: build_preset("nano", t, seed=0),
        "llama-lora": _lora,
        "llama-lora-on-lm_head": lambda t: _lora(t, ["q_proj", "lm_head"]),
    }[arch](tokenizer)
    model.eval()
    batch = _rollouts(G=4, N=2, vocab=len(tokenizer))
    packed = pack(batch.prompts, batch.completions_R_T, batch.mask_R_T)
    assert packed.input_ids_P_W.shape[0] < len(batch.prompts)  # some rows hold several sequences
    with torch.no_grad():
        logp_N, _, _ = PolicyWithValue(model)(
            packed.input_ids_P_W, packed.position_ids_P_W, packed.index_N, packed.targets_N
        )
        alone = []
        for prompt, c, n in zip(
            batch.prompts, batch.completions_R_T.tolist(), batch.mask_R_T.sum(-1).tolist()
        ):
            logits = model(input_ids=torch.tensor([prompt + c[:n]])).logits[0]
            logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + n], -1)
            alone.append(logp.gather(-1, torch.tensor(c[:n])[:, None]).squeeze(-1))
    torch.testing.assert_close(logp_N, torch.cat(alone), rtol=0, atol=1e-5)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "lm_head"]])
def test_the_adapter_disabled_reference_gives_the_base_model_logprobs(tokenizer, targets):
    from temper.train.rl_update import AdapterDisabled

    base = build_preset("nano", tokenizer, seed=0).eval()
    policy = _lora(tokenizer, targets).eval()
    batch = _rollouts(vocab=len(tokenizer))
    p = Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, *[None] * 6)
    with torch.no_grad():
        reference = forward_rows(PolicyWithValue(AdapterDisabled(policy)), p)[0].logp
        expected = forward_rows(PolicyWithValue(base), p)[0].logp
        adapted = forward_rows(PolicyWithValue(policy), p)[0].logp
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-6)
    assert (adapted - expected).abs().max() > 1e-3


def test_pack_layout_by_hand():
    prompts = [[1, 2, 3, 4, 5], [1, 2], [1]]
    completions = torch.tensor([[7, 8], [9, 0], [5, 6]])
    mask = completions != 0
    packed = pack(prompts, completions, mask)
    # inputs: seq0 = 1 2 3 4 5 7 (6 tokens, the width); seq1 = 1 2 (2); seq2 = 1 5 (2) -> one row of 4 + pad
    assert packed.input_ids_P_W.tolist() == [[1, 2, 3, 4, 5, 7], [1, 2, 1, 5, 0, 0]]
    assert packed.position_ids_P_W.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 2, 3]]
    # seq0's completion is predicted at positions 4, 5; seq1's at 7; seq2's at 8, 9
    assert packed.index_N.tolist() == [4, 5, 7, 8, 9]
    assert packed.targets_N.tolist() == [7, 8, 9, 5, 6]


# ---- dropout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "llama-attention-dropout"])
def test_first_update_is_exactly_on_policy_for_a_model_with_dropout(tokenizer, arch):
    def first_step(dropout: bool) -> dict[str, list[float]]:
        model = _gpt2(tokenizer) if arch == "gpt2" else _llama_with_dropout(tokenizer)
        config = RLConfig(advantage="grpo", max_new_tokens=MAX_NEW_TOKENS, dropout=dropout, grad_clip=0.0)
        module = policy_with_value(model, config)
        module.eval()  # the "sampler" logprobs: teacher forcing without dropout
        batch = _off_policy(module, _rollouts(vocab=len(tokenizer)), noise=0.0)
        p = prepare(batch, module, None, config)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.0)
        torch.manual_seed(0)
        stats, _ = update(module, optimizer, p, config, step=0, lr=0.0)
        return stats

    assert model_has_dropout(tokenizer, arch)
    off = first_step(dropout=False)
    assert off["ratio_mean"] == [1.0] and off["approx_kl"] == [0.0] and off["clip_frac"] == [0.0]
    on = first_step(dropout=True)  # the option keeps dropout: the first step is off-policy
    assert on["ratio_mean"][0] != 1.0 and on["approx_kl"][0] > 1e-4


def model_has_dropout(tokenizer, arch) -> bool:
    model = _gpt2(tokenizer) if arch == "gpt2" else _llama_with_dropout(tokenizer)
    return (
        model.config.to_dict().get("attention_dropout") or model.config.to_dict().get("resid_pdrop", 0)
    ) > 0


# ---- the data-parallel contract -------------------------------------------------------------------


class _ThreadAccelerator:
    """Stands in for accelerate's Accelerator in one of W threads: `reduce` sums over the threads,
    `backward` is plain backward (the test averages the W gradients afterwards, as DDP does)."""

    def __init__(self, rank: int, world: int, barrier: threading.Barrier, slots: list):
        self.rank, self.num_processes, self.barrier, self.slots = rank, world, barrier, slots
        self.backward_calls = self.no_sync_calls = 0

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        assert reduction == "sum"
        self.slots[self.rank] = tensor.detach().clone()
        self.barrier.wait()
        total = sum(self.slots)
        self.barrier.wait()
        return total

    def backward(self, loss: torch.Tensor) -> None:
        self.backward_calls += 1
        loss.backward()

    def no_sync(self, module):
        self.no_sync_calls += 1
        return contextlib.nullcontext()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_data_parallel_contract_gives_the_one_process_gradient(tokenizer, aggregation):
    import copy

    config = _config(aggregation=aggregation, micro_batch_size=2)
    module, p = _setup(tokenizer, config)
    terms = loss_terms(config, p)
    single, _ = _gradient(module, p, terms, config)

    W = 2
    shards = [p.rows(torch.tensor([0, 2, 4, 6, 8])), p.rows(torch.tensor([1, 3, 5, 7]))]  # unequal shares
    replicas = [copy.deepcopy(module) for _ in range(W)]
    barrier, slots = threading.Barrier(W), [None] * W
    accelerators = [_ThreadAccelerator(r, W, barrier, slots) for r in range(W)]
    grads, errors = [None] * W, []

    def work(r):
        try:
            grads[r] = _gradient(replicas[r], shards[r], terms, config, accelerators[r])[0]
        except Exception as err:  # surfaced below
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ddp_mean = sum(grads) / W  # DDP all-reduces the mean of the processes' gradients
    torch.testing.assert_close(ddp_mean, single, rtol=1e-10, atol=1e-12)
    assert accelerators[0].backward_calls == 3 and accelerators[0].no_sync_calls == 2  # 5 rows, micro 2


def test_a_one_process_accelerator_gives_the_plain_gradient(tokenizer):
    from accelerate import Accelerator

    config = _config(micro_batch_size=4)
    module, p = _setup(tokenizer, config)
    terms = loss_terms(config, p)
    plain, plain_stats = _gradient(module, p, terms, config)
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 1
    accelerated, stats = _gradient(module, p, terms, config, accelerator)
    torch.testing.assert_close(accelerated, plain, rtol=0, atol=0)
    assert stats["loss"] == plain_stats["loss"]


def test_train_rl_first_step_is_on_policy_for_gpt2_with_dropout(tokenizer, tmp_path):
    # end to end: the ratio's denominator is the sampler's logprobs (KV-cached decoding), so equal
    # to rounding, not bitwise; with dropout in the update it was 0.047 before this option existed
    from fakes import FirstByteTask
    from temper.train.rl import train_rl
    from test_rl import _config

    rows = {}
    for dropout in (False, True):
        result = train_rl(
            _gpt2(tokenizer),
            tokenizer,
            [FirstByteTask()],
            _config(steps=1, dropout=dropout),
            tmp_path / str(dropout),
        )
        rows[dropout] = result.history[0]
    assert rows[False]["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and rows[False]["approx_kl"] < 1e-10
    assert rows[True]["approx_kl"] > 1e-5


def test_several_epochs_and_minibatches_log_one_loss_per_optimizer_step(tokenizer):
    config = _config(epochs=2, minibatches=2, micro_batch_size=3)
    module, p = _setup(tokenizer, config, dtype=torch.float32)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    before = [q.detach().clone() for q in module.parameters()]
    stats, tokens = update(module, optimizer, p, config, step=0, lr=1e-3)
    assert len(stats["loss"]) == len(stats["grad_norm"]) == 4
    assert all(len(stats[f"loss/{name}"]) == 4 for name in TERMS)
    assert tokens > 0 and any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_a_minibatch_without_completion_tokens_adds_nothing_not_nan(tokenizer):
    config = _config(advantage="grpo", kl_coef=0.0)
    module, p = _setup(tokenizer, config)
    empty = p.rows(torch.tensor([1]))  # a single one-token completion...
    empty.mask = torch.zeros_like(empty.mask)  # ...masked out entirely
    grads, stats = _gradient(module, empty, loss_terms(config, empty), config)
    assert (grads == 0).all() and stats["loss"] == [0.0]


# ---- exact cases, folded in from test_rl_update_exact.py ---------------------------------------
# The RL update's plumbing on hand-computed numbers: temperature fallback, fp32 logprobs, the
# soft-capping guard, the one-position vocabulary projection, the config reaching each loss term,
# learning rate / dropout / token count / gradient clipping in `update`, the shuffle's independence of
# the global RNG, and the data-parallel calls (backward, no_sync, reduce "sum", clip) of one step.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
# A toy module stands in for the LM where only the update's arithmetic matters: its per-token logprob is
# one parameter `b` (so the ratio is exp(b) against old logprobs 0) and it records the packed rows it reads.


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


def _update_config(**kw) -> RLConfig:
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_the_value_head_is_in_the_dtype_of_the_logprobs(tokenizer, dtype):
    """A fp64 model's value head is fp64 (the hidden state it reads stays fp64), a bf16 one's fp32."""
    module = policy_with_value(build_preset("nano", tokenizer, seed=1).to(dtype), _config())
    assert module.value.proj.weight.dtype == _at_least_fp32(torch.ones(1, dtype=dtype)).dtype
    batch = _rollouts(vocab=len(tokenizer))
    out = forward_rows(module, Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, *[None] * 6))[0]
    assert out.values.dtype == out.logp.dtype == module.value.proj.weight.dtype


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
    config = _update_config(clip_low=0.1, clip_high=0.28)
    p = _prepared([1], advantage=-1.0)
    out = TokenOutputs(torch.full((1, 1), math.log(0.5), dtype=torch.float64), torch.zeros(1, 1), None)
    per_token, _ = loss_terms(config, p)[0].per_token(out, p, config)
    assert per_token.item() == pytest.approx(0.9, abs=1e-12)


def test_the_value_term_uses_the_configured_value_clip():
    """V = 0.5, V_old = 0, R = 1, clip 0.1: 0.5 max((0.5 - 1)^2, (0.1 - 1)^2) = 0.405 (0.32 with the
    default clip 0.2, 0.125 unclipped); the clipped branch wins: value_clip_frac 1."""
    config = _update_config(advantage="gae", value_clip=0.1)
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
    config = _update_config(epochs=2, micro_batch_size=1)
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
                       _update_config(minibatches=3), step=0, lr=0.0)  # fmt: skip
    assert tokens == 9


def test_grad_clip_zero_means_no_clipping():
    """A = 2: grad -2, SGD lr 0.1 -> b = 0.2 (clipping at norm 0 would leave b at 0)."""
    module = _Toy()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    stats, _ = update(
        module, optimizer, _prepared([2, 1], advantage=2.0), _update_config(grad_clip=0.0), step=0, lr=0.1
    )
    assert "grad_norm" not in stats and module.b.item() == pytest.approx(0.2, abs=1e-12)


def test_the_minibatch_shuffle_ignores_the_global_rng():
    """The order is a function of (seed, step, epoch) only: the same under any global seed."""
    orders = []
    for global_seed in (0, 1, 2):
        torch.manual_seed(global_seed)
        module = _Toy()
        update(module, torch.optim.SGD(module.parameters(), lr=0.0), _prepared([1] * 6),
               _update_config(minibatches=6, epochs=2), step=3, lr=0.0)  # fmt: skip
        orders.append(module.seen)
    assert orders[0] == orders[1] == orders[2]
    assert orders[0][:6] != orders[0][6:]  # epochs differ


def test_a_minibatch_of_one_token_is_divided_by_one():
    stats: dict[str, list[float]] = {}
    config = _update_config()
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
    stats, _ = update(module, optimizer, _prepared([1, 3, 2]), _update_config(micro_batch_size=1, grad_clip=10.0),
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


def test_unequal_rows_over_processes_are_refused_only_where_minibatches_would_not_pair_up():
    """An agent that rewrote its history gives its process more rows; with several minibatches
    `torch.chunk` could then give the processes different numbers of optimizer steps (a hang),
    so the update stops naming the counts; with one minibatch any counts pair up."""
    from temper.train.rl_update import same_rows_everywhere

    class Gathering:
        num_processes, device = 2, "cpu"

        def __init__(self, other):
            self.other = other

        def gather(self, t):
            return torch.cat([t, torch.tensor([self.other])])

    same_rows_everywhere(5, _config(minibatches=1), Gathering(4))
    same_rows_everywhere(4, _config(minibatches=2), Gathering(4))
    same_rows_everywhere(5, _config(minibatches=2), None)
    with pytest.raises(ValueError, match=r"the processes hold \[5, 4\] batch rows"):
        same_rows_everywhere(5, _config(minibatches=2), Gathering(4))
