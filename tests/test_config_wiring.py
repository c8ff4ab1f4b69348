"""Each setting of the RL trainer reaches the pure function it configures, table-driven: for every
field, the wrapper's result with the field moved off its base value equals the pure function of
`temper.algorithms` given that value on the same tensors, and differs from the result at the base
value (so the field matters on these tensors and a wrapper that drops it, or passes another field
in its place, fails).

The defect class this closes: a wrapper (`rl_update.prepare`, `loss_terms`, `policy_with_value`)
that drops or miswires a config argument before calling a well-tested pure function; the pure
functions' own tests cannot see it. The supervised loop's `TrainConfig` (lr, schedule, warm-up,
min_lr_ratio, betas, weight decay, grad clip) is checked the same way against a plain loop in
`test_supervised_exact.py::test_three_steps_match_a_plain_full_batch_loop`, and each preference
method's fields in `test_objectives.py::test_every_field_of_a_method_reaches_its_pure_loss`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from temper.algorithms.advantages import grpo, rloo
from temper.algorithms.policy import kl_k3, kl_penalized_rewards, policy_loss
from temper.algorithms.value import gae, masked_whiten, value_loss
from temper.models import build_preset
from temper.train.rl_config import RLConfig
from temper.train.rl_update import backward_minibatch, forward_rows, loss_terms, policy_with_value, prepare
from test_rl_update import MAX_NEW_TOKENS, _off_policy, _rollouts


def _base(**kw) -> RLConfig:
    """Every loss and advantage setting away from RLConfig's defaults, and from each other (a
    wrapper passing clip_low as clip_high, or gamma as lam, gives a different number)."""
    base = dict(
        advantage="gae",
        temperature=0.7,
        max_new_tokens=MAX_NEW_TOKENS,
        entropy_coef=0.1,
        kl_coef=0.2,
        kl_mode="loss",
        vf_coef=0.4,
        clip_low=0.15,
        clip_high=0.28,
        dual_clip=1.5,
        value_clip=0.05,
        gamma=0.97,
        lam=0.9,
        grpo_eps=1e-6,
    )
    return RLConfig(**(base | kw))


def _models(tokenizer):
    policy = build_preset("nano", tokenizer, seed=1).to(torch.float64)
    reference = build_preset("nano", tokenizer, seed=2).to(torch.float64).requires_grad_(False)
    return policy, reference


def _module(policy, config):
    module = policy_with_value(policy, config).to(torch.float64)
    if module.value is not None:
        torch.nn.init.normal_(module.value.proj.weight, generator=torch.Generator().manual_seed(4), std=0.3)
    return module


def _padded_logp(model, prompts, completions_R_T, mask_R_T, temperature) -> torch.Tensor:
    """log p(sampled token) at `temperature`, the plain way: right-padded rows, logits at every
    position, softmax over logits / T (0 at masked positions)."""
    R, T = mask_R_T.shape
    lengths = mask_R_T.sum(-1).tolist()
    seqs = [p + c[:n] for p, c, n in zip(prompts, completions_R_T.tolist(), lengths)]
    L = max(len(s) for s in seqs)
    ids = torch.zeros(R, L, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
    with torch.no_grad():
        logits = model(input_ids=ids).logits / temperature
    pos = (torch.tensor([len(p) - 1 for p in prompts])[:, None] + torch.arange(T)[None, :]).clamp_max(L - 1)
    logp_all = torch.log_softmax(logits.gather(1, pos[..., None].expand(R, T, logits.shape[-1])), -1)
    return logp_all.gather(-1, completions_R_T[..., None]).squeeze(-1) * mask_R_T


# ---- advantages: prepare passes every setting to its estimator ------------------------------------


def _expected_advantages(config: RLConfig, batch, reference, old_values) -> torch.Tensor:
    """The advantages written out from the pure functions with the config's values."""
    mask = batch.mask_R_T
    beta = config.kl_coef if config.kl_mode == "reward" else 0.0
    ref_logp = _padded_logp(reference, batch.prompts, batch.completions_R_T, mask, config.temperature)
    k1 = (batch.old_logprobs_R_T - ref_logp) * mask
    if config.advantage == "gae":
        rewards = kl_penalized_rewards(batch.rewards_G_N.reshape(-1), k1, mask, beta)
        advantages, _ = gae(rewards, old_values, mask, config.gamma, config.lam)
        return masked_whiten(advantages, mask) if config.whiten_advantages else advantages
    rewards_G_N = batch.rewards_G_N - beta * k1.sum(-1).reshape(batch.rewards_G_N.shape)
    per_sample = grpo(rewards_G_N, eps=config.grpo_eps) if config.advantage == "grpo" else rloo(rewards_G_N)
    return torch.where(mask, per_sample.reshape(-1, 1), 0.0)


# (base overrides, the field moved, its value)
ADVANTAGE_SETTINGS = [
    ({}, "gamma", 0.8),
    ({}, "lam", 0.5),
    ({}, "whiten_advantages", False),
    ({"kl_mode": "reward"}, "kl_coef", 0.5),
    ({"kl_mode": "reward"}, "temperature", 1.3),
    ({"kl_mode": "reward"}, "kl_mode", "loss"),
    ({"advantage": "grpo", "kl_mode": "reward"}, "kl_coef", 0.5),
    ({"advantage": "grpo", "kl_mode": "reward"}, "temperature", 1.3),
    ({"advantage": "rloo", "kl_mode": "reward"}, "kl_coef", 0.5),
    ({"advantage": "grpo"}, "grpo_eps", 0.7),
]


@pytest.mark.parametrize(
    "overrides,field,value",
    ADVANTAGE_SETTINGS,
    ids=[f"{o.get('advantage', 'gae')}-{f}" for o, f, _ in ADVANTAGE_SETTINGS],
)
def test_each_advantage_setting_reaches_its_estimator(tokenizer, overrides, field, value):
    policy, reference = _models(tokenizer)
    base = _base(**overrides)
    module = _module(policy, base)
    batch = _off_policy(module, _rollouts(vocab=len(tokenizer)))
    results = {}
    for name, config in (("base", base), ("moved", replace(base, **{field: value}))):
        p = prepare(batch, _module(policy, config), reference, config)
        expected = _expected_advantages(config, batch, reference, p.old_values)
        torch.testing.assert_close(p.advantages, expected, rtol=1e-6, atol=1e-7, check_dtype=False)
        results[name] = p.advantages
    assert (results["moved"] - results["base"]).abs().max() > 1e-4, f"{field} changes nothing here"


def test_the_reference_logprobs_are_at_the_configured_temperature(tokenizer):
    """prepare's reference logprobs and k1 equal the padded forward at T (the KL of a run sampled at
    T is taken between the policy and the reference at the same T)."""
    policy, reference = _models(tokenizer)
    for temperature in (0.7, 1.3):
        config = _base(temperature=temperature)
        module = _module(policy, config)
        batch = _off_policy(module, _rollouts(vocab=len(tokenizer)))
        p = prepare(batch, module, reference, config)
        expected = _padded_logp(reference, batch.prompts, batch.completions_R_T, batch.mask_R_T, temperature)
        torch.testing.assert_close(p.ref_logp, expected, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(p.ref_kl, (batch.old_logprobs_R_T - expected) * batch.mask_R_T)


def test_the_policys_logprobs_are_at_the_configured_temperature(tokenizer):
    policy, _ = _models(tokenizer)
    batch = _rollouts(vocab=len(tokenizer))
    for temperature in (0.7, 1.0, 1.3):
        module = _module(policy, _base(temperature=temperature))
        p = prepare(batch, module, None, _base(temperature=temperature, kl_coef=0.0))
        got = forward_rows(module, p)[0].logp
        expected = _padded_logp(policy, batch.prompts, batch.completions_R_T, batch.mask_R_T, temperature)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


# ---- the loss: each setting reaches its term ------------------------------------------------------


def _expected_loss(config: RLConfig, module, p) -> float:
    """The minibatch loss composed from the pure functions with the config's values: the policy
    loss (clip_low, clip_high, dual_clip), - entropy_coef x entropy, + kl_coef x k3 (kl_mode loss),
    each reduced by `aggregation` (constant: over rows x max_new_tokens), + vf_coef x the clipped
    value loss (value_clip), a token mean."""
    with torch.no_grad():
        out = forward_rows(module, p)[0]
    m = p.mask.to(out.logp.dtype)
    R = m.shape[0]

    def agg(x, mode):
        if mode == "token":
            return (x * m).sum() / m.sum()
        if mode == "sample":
            return ((x * m).sum(-1) / m.sum(-1)).mean()
        return (x * m).sum() / (R * config.max_new_tokens)

    pg, _ = policy_loss(
        out.logp, p.old_logp, p.advantages, p.mask,
        clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
    )  # fmt: skip
    total = agg(pg, config.aggregation) - config.entropy_coef * agg(out.entropy, config.aggregation)
    if config.kl_mode == "loss":
        total = total + config.kl_coef * agg(kl_k3(out.logp, p.ref_logp), config.aggregation)
    vf, _ = value_loss(out.values, p.old_values, p.returns, p.mask, clip=config.value_clip)
    return float(total + config.vf_coef * agg(vf, "token"))


LOSS_SETTINGS = [
    ("clip_low", 0.05),
    ("clip_high", 0.6),
    ("dual_clip", 4.0),
    ("dual_clip", None),
    ("entropy_coef", 0.5),
    ("entropy_coef", 0.0),
    ("kl_coef", 0.9),
    ("kl_mode", "reward"),
    ("vf_coef", 1.5),
    ("value_clip", 0.5),
    ("aggregation", "sample"),
    ("aggregation", "constant"),
    ("max_new_tokens", 2 * MAX_NEW_TOKENS),
]


@pytest.mark.parametrize("field,value", LOSS_SETTINGS, ids=[f"{f}={v}" for f, v in LOSS_SETTINGS])
def test_each_loss_setting_reaches_its_loss_term(tokenizer, field, value):
    """One minibatch's logged loss (the value `backward_minibatch` differentiates) equals the pure
    composition at the base config and with `field` moved, and the two differ."""
    policy, reference = _models(tokenizer)
    base = _base(aggregation="constant" if field == "max_new_tokens" else "token")
    module = _module(policy, base)
    batch = _off_policy(module, _rollouts(vocab=len(tokenizer)))
    p = prepare(batch, module, reference, base)
    with torch.no_grad():  # values away from the old values, so the value clip bites
        module.value.proj.weight.add_(
            torch.randn(
                module.value.proj.weight.shape,
                generator=torch.Generator().manual_seed(5),
                dtype=torch.float64,
            )
            * 0.3
        )
    got = {}
    for name, config in (("base", base), ("moved", replace(base, **{field: value}))):
        stats: dict[str, list[float]] = {}
        backward_minibatch(module, p, loss_terms(config, p), config, stats)
        assert stats["loss"][0] == pytest.approx(_expected_loss(config, module, p), rel=1e-6)
        got[name] = stats["loss"][0]  # (summed in fp32: the log's precision)
    assert abs(got["moved"] - got["base"]) > 1e-4 * abs(got["base"]), f"{field} changes nothing here"


# ---- the sampling stages pass their sampling settings to the sampler ------------------------------


class _Recorded(Exception):
    pass


class _RecordingSampler:
    """Records what one `sample` call was asked for, then stops the stage."""

    def __init__(self, *args, **kwargs):
        self.calls = _RecordingSampler.calls

    calls: list = []

    def sample(self, prompts, n, *, max_new_tokens, temperature, seed, **rest):
        self.calls.append((len(prompts), n, max_new_tokens, temperature, seed))
        raise _Recorded


def test_an_rft_rounds_sampling_settings_reach_the_sampler(tokenizer):
    from temper.rollout.sampler import derive_seed
    from temper.stages.rft import RFTStage, sample_round
    from test_rft import FirstByteTask

    _RecordingSampler.calls = []
    stage = RFTStage(
        kind="rft", tasks=["first_byte"], prompts=6, k=3, temperature=1.7, max_new_tokens=5, seed=4
    )
    with pytest.raises(_Recorded):
        sample_round(_RecordingSampler(), tokenizer, {"first_byte": FirstByteTask()}, stage, 2)
    assert _RecordingSampler.calls == [(6, 3, 5, 1.7, derive_seed(4, 2, 7919))]


def test_prompt_distillations_teacher_sampling_settings_reach_the_sampler(tokenizer, tmp_path, monkeypatch):
    import temper.stages.prompt_distill as pd
    from temper.rollout.sampler import derive_seed
    from test_rft import FirstByteTask

    _RecordingSampler.calls = []
    monkeypatch.setattr(pd, "HFSampler", _RecordingSampler)
    stage = pd.PromptDistillStage(
        kind="prompt_distill", tasks=["first_byte"], system="Answer in capitals.", prompts=6, k=3,
        temperature=1.7, max_new_tokens=5, seed=4,
    )  # fmt: skip
    with pytest.raises(_Recorded):
        pd.teacher_samples(None, tokenizer, {"first_byte": FirstByteTask()}, stage, tmp_path)
    assert _RecordingSampler.calls == [(6, 3, 5, 1.7, derive_seed(4, 7919))]


@pytest.mark.parametrize("advantage", ["turn_grpo", "turn_reinforce"])
def test_turn_gamma_reaches_the_turn_estimators(tokenizer, advantage):
    """On three multi-turn episodes with process rewards (two would make GRPO's normalized
    advantages +-1/sqrt(2) whatever the returns), prepare's advantages are the turn
    estimator's (hand-checked in test_turn_credit.py) at the configured turn_gamma."""
    from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
    from temper.tasks.base import Problem
    from temper.train.rollouts import grade_episodes, to_batch
    from test_fixture_audit_loop import A, B, _episode

    C = _episode([([30, 31], [-0.2, -0.1]), ([32], [-0.5])], [[95, 96]], [3.0, -1.0])
    group = grade_episodes(Problem("t", "train", "p", "q"), [A, B, C], {"outcome": 1.0, "process": 0.5}, 8, 0)
    batch = to_batch([group])
    policy, _ = _models(tokenizer)
    got = {}
    for gamma in (1.0, 0.5):
        config = _base(advantage=advantage, kl_coef=0.0, turn_gamma=gamma)
        p = prepare(batch, _module(policy, config), None, config)
        inputs = AdvantageInputs(
            rewards_G_N=batch.rewards_G_N, mask_R_T=batch.mask_R_T, turn_R_T=batch.turn_R_T,
            step_rewards_R_K=batch.step_rewards_R_K, turns_R=batch.turns_R, turn_gamma=gamma,
        )  # fmt: skip
        torch.testing.assert_close(p.advantages, ESTIMATORS[advantage](inputs)[0])
        got[gamma] = p.advantages
    assert (got[1.0] - got[0.5]).abs().max() > 1e-3


def test_the_minibatch_shuffle_depends_on_the_seed_the_step_and_the_epoch(monkeypatch):
    """Each (seed, step, epoch) partitions the rows into its own minibatches: a shuffle that left
    out the step (or the seed) would give every step of a run (every run) the same partition."""
    import temper.train.rl_update as rl_update
    from temper.train.rl_update import Prepared, update

    seen: list[list[int]] = []
    monkeypatch.setattr(
        rl_update, "backward_minibatch", lambda module, p, *rest: seen.append([q[0] for q in p.prompts]) or 0
    )
    R = 8
    p = Prepared([[i] for i in range(R)], torch.zeros(R, 1, dtype=torch.long), torch.ones(R, 1, dtype=torch.bool),
                 torch.zeros(R, 1), torch.zeros(R, 1), None, None, None, None)  # fmt: skip
    module = torch.nn.Linear(1, 1)
    partitions = {}
    for seed, step in ((0, 0), (0, 1), (1, 0)):
        seen.clear()
        config = _base(seed=seed, epochs=2, minibatches=2, grad_clip=0.0)
        update(module, torch.optim.SGD(module.parameters(), lr=0.0), p, config, step, 0.0)
        assert len(seen) == 4 and all(sorted(a + b) == list(range(R)) for a, b in (seen[:2], seen[2:]))
        partitions[seed, step] = [sorted(seen[0]), sorted(seen[2])]  # epoch 0's first minibatch, epoch 1's
        assert partitions[seed, step][0] != partitions[seed, step][1]  # the epochs differ
    assert partitions[0, 0] != partitions[0, 1] and partitions[0, 0] != partitions[1, 0]
