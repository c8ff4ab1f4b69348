"""The RL sampler against references: a teacher-forced forward of the same model (logprobs,
greedy tokens), transformers' `model.generate` (greedy output) and itself without prefill sharing."""

import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from temper.models import apply_lora, build_preset
from temper.rollout import HFSampler, Sample, prompt_seeds, stop_ids
from temper.rollout.fast_decode import LlamaDecodeStep
from temper.rollout.sampling import choose_tokens

MAX_NEW = 10
PINNED_SEEDS = [5046677104938694277, 2024819301478721300]  # prompt_seeds(0, 2)


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_preset("nano", tokenizer, seed=0)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["hi", "What is 12 + 345? Reply as `Answer: <x>`.", "2+2="]
    out = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in texts
    ]
    assert len({len(p) for p in out}) == len(out)  # different lengths: left padding is exercised
    return out


def teacher_forced(model, prompt: list[int], tokens: list[int], temperature: float):
    """(logprobs of `tokens` under log_softmax(logits / T), argmax at each position), one unpadded forward."""
    with torch.no_grad():
        logits_T_V = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logp_T_V = torch.log_softmax(logits_T_V / (temperature or 1.0), dim=-1)
    return logp_T_V.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1), logits_T_V.argmax(-1).tolist()


def assert_matches_teacher(model, samples: list[list[Sample]], temperature: float, tol: float = 1e-4):
    for row in samples:
        for s in row:
            assert len(s.logprobs) == len(s.token_ids) > 0
            expected, _ = teacher_forced(model, s.prompt_ids, s.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=tol, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("max_batch_rows", [256, 4])  # 4: a prompt's samples span chunks
@pytest.mark.parametrize("fast_decode", [True, False])
def test_logprobs_match_teacher_forcing(model, tokenizer, prompts, temperature, max_batch_rows, fast_decode):
    sampler = HFSampler(model, tokenizer, max_batch_rows=max_batch_rows, fast_decode=fast_decode)
    out = sampler.sample(prompts, 3, max_new_tokens=MAX_NEW, temperature=temperature, seed=1)
    assert [len(r) for r in out] == [3, 3, 3]
    assert [s.prompt_ids for s in out[1]] == [prompts[1]] * 3
    assert_matches_teacher(model, out, temperature)


def test_eager_attention(tokenizer, prompts):
    """eager attention gets an additive 4D mask instead of sdpa's boolean one."""
    model = build_preset("nano", tokenizer, seed=0)
    model.set_attn_implementation("eager")
    out = HFSampler(model, tokenizer, fast_decode=False).sample(
        prompts, 2, max_new_tokens=MAX_NEW, temperature=0.7
    )
    assert_matches_teacher(model, out, 0.7)


def hf_greedy(model, tokenizer, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """`model.generate` on the left-padded batch, greedy, with every option that changes the output set
    (a model's generation_config cannot leak in): the new ids of each row, cut after its first stop id."""
    pad, stops = tokenizer.pad_token_id, stop_ids(model, tokenizer)
    width = max(len(p) for p in prompts)
    ids_B_P = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask_B_P = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=stops,
        pad_token_id=pad,
        num_beams=1,
        repetition_penalty=1.0,
    )
    with torch.no_grad():
        out_B_L = model.generate(input_ids=ids_B_P, attention_mask=mask_B_P, generation_config=config)
    rows = []
    for new in out_B_L[:, width:].tolist():
        end = next((j + 1 for j, t in enumerate(new) if t in stops), len(new))
        rows.append(new[:end])
    return rows


def qwen2_gqa(tokenizer):
    """A Qwen2 model (biases on q, k, v) with grouped-query attention: 4 query heads, 2 kv heads."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # nonzero biases, so a dropped bias shows
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2_gqa"])
def test_fast_decode_step_equals_model_forward(tokenizer, prompts, arch):
    """LlamaDecodeStep against transformers' forward: same tokens, logprobs to rounding, with rows
    stopping at different steps (many stop ids) and being dropped from the batch."""
    model = build_preset("nano", tokenizer, seed=0) if arch == "llama" else qwen2_gqa(tokenizer)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *range(40, 50)]
    assert LlamaDecodeStep.build(model) is not None  # the fast path is the one under test
    kw = dict(max_new_tokens=24, temperature=1.0, seed=2)
    fast = HFSampler(model, tokenizer).sample(prompts, 4, **kw)
    reference = HFSampler(model, tokenizer, fast_decode=False).sample(prompts, 4, **kw)
    assert {s.stop_reason for r in fast for s in r} == {"eos", "length"}
    for r1, r2 in zip(fast, reference, strict=True):
        for s1, s2 in zip(r1, r2, strict=True):
            assert s1.token_ids == s2.token_ids and s1.stop_reason == s2.stop_reason
            torch.testing.assert_close(
                torch.tensor(s1.logprobs), torch.tensor(s2.logprobs), atol=1e-5, rtol=0
            )
    assert_matches_teacher(model, fast, 1.0)


def test_fast_decode_step_only_where_exact(tokenizer):
    """The fast step refuses what it does not reproduce: hooks on a module, non-fp32 weights,
    autocast, a length-dependent rotary embedding, a module it does not know (an adapter in
    place of a Linear)."""
    model = build_preset("nano", tokenizer, seed=0)
    assert LlamaDecodeStep.build(model) is not None
    # a forward asking for hidden states (the RL update's) leaves transformers' passive
    # output-capturing hooks on the layers: they must not turn the fast path off
    model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    assert any(m._forward_hooks for m in model.modules())
    assert LlamaDecodeStep.build(model) is not None
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *args: None)
    assert LlamaDecodeStep.build(model) is None
    handle.remove()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert LlamaDecodeStep.build(model) is None
    model.model.rotary_emb.rope_type = "dynamic"  # frequencies that change with the length
    assert LlamaDecodeStep.build(model) is None
    model.model.rotary_emb.rope_type = "default"
    assert LlamaDecodeStep.build(model) is not None
    peft_model = apply_lora(build_preset("nano", tokenizer, seed=0), r=4, alpha=8)
    assert LlamaDecodeStep.build(peft_model) is None
    assert LlamaDecodeStep.build(peft_model.base_model.model) is None  # LoRA layers inside a Llama
    model.model.layers[1].self_attn.v_proj = torch.nn.Sequential(model.model.layers[1].self_attn.v_proj)
    assert LlamaDecodeStep.build(model) is None
    assert LlamaDecodeStep.build(build_preset("nano", tokenizer, seed=0).to(torch.bfloat16)) is None


def test_greedy_is_teacher_argmax_and_generate(model, tokenizer, prompts):
    out = HFSampler(model, tokenizer).sample(prompts, 2, max_new_tokens=MAX_NEW, temperature=0.0)
    reference = hf_greedy(model, tokenizer, prompts, MAX_NEW)
    one_row = HFSampler(model, tokenizer, max_batch_rows=1).sample(
        prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0
    )
    for prompt, (a, b), ref, (single,) in zip(prompts, out, reference, one_row, strict=True):
        assert a == b
        logp, argmax = teacher_forced(model, prompt, a.token_ids, 1.0)  # greedy logprobs are T=1
        assert a.token_ids == argmax == ref == single.token_ids  # padded batch == one prompt alone
        # this random model never emits eos in MAX_NEW steps: a length stop
        assert a.stop_reason == "length" and len(a.token_ids) == MAX_NEW
        assert a.text == tokenizer.decode(ref, skip_special_tokens=True)
        torch.testing.assert_close(torch.tensor(a.logprobs), logp, atol=1e-4, rtol=0)


def test_seeded_sampling_is_reproducible(model, tokenizer, prompts):
    sampler = HFSampler(model, tokenizer)
    rng = torch.get_rng_state()
    was_training = model.training
    model.train()
    try:
        a = sampler.sample(prompts, 2, max_new_tokens=MAX_NEW, seed=3)
        assert model.training  # the module's mode is restored
    finally:
        model.train(was_training)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is not touched
    assert sampler.sample(prompts, 2, max_new_tokens=MAX_NEW, seed=3) == a
    b = sampler.sample(prompts, 2, max_new_tokens=MAX_NEW, seed=4)
    assert [s.token_ids for r in a for s in r] != [s.token_ids for r in b for s in r]


def test_per_prompt_seeds_make_samples_independent_of_the_batch(tokenizer, prompts):
    """Sample j of prompt i depends on (seeds[i], j, prompt, model) only: the same alone, in another
    order, chunked by another max_batch_rows, beside rows that stop at other steps (many stop ids,
    so rows are dropped mid-batch) or beside other prompts."""
    model = build_preset("nano", tokenizer, seed=0)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *range(40, 60)]
    seeds, kw = [11, 22, 33], dict(max_new_tokens=24, temperature=1.0)

    def check(a: list[Sample], b: list[Sample]) -> None:
        assert [(s.token_ids, s.stop_reason) for s in a] == [(s.token_ids, s.stop_reason) for s in b]
        for s, t in zip(a, b, strict=True):
            torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-5, rtol=0)

    batch = HFSampler(model, tokenizer).sample(prompts, 4, seed=seeds, **kw)
    reasons = {s.stop_reason for r in batch for s in r}
    assert reasons == {"eos", "length"}  # rows finish at different steps
    for i, p in enumerate(prompts):
        check(HFSampler(model, tokenizer).sample([p], 4, seed=[seeds[i]], **kw)[0], batch[i])
    reordered = HFSampler(model, tokenizer, max_batch_rows=3).sample(prompts[::-1], 4, seed=seeds[::-1], **kw)
    for a, b in zip(reordered[::-1], batch, strict=True):
        check(a, b)
    # other neighbours: prompt 0 twice with another seed, prompt 1 beside it
    (other, mine) = HFSampler(model, tokenizer).sample([prompts[0], prompts[1]], 4, seed=[99, seeds[1]], **kw)
    check(mine, batch[1])
    assert [s.token_ids for s in other] != [s.token_ids for s in batch[0]]
    # an int seed stands for per-prompt seeds derived from (seed, i)
    sampler = HFSampler(model, tokenizer)
    assert sampler.sample(prompts, 2, seed=7, **kw) == sampler.sample(
        prompts, 2, seed=prompt_seeds(7, 3), **kw
    )
    with pytest.raises(ValueError, match="seeds"):
        sampler.sample(prompts, 2, seed=[1, 2], **kw)


def test_prompt_seeds_are_pinned():
    """Derived seeds are part of what a run reproduces (and what separate processes must agree
    on): a change to the derivation changes every sample, so it must show here."""
    assert prompt_seeds(0, 2) == PINNED_SEEDS
    assert prompt_seeds([5, 6], 2) == [5, 6]


def test_samples_of_one_prompt_differ(model, tokenizer, prompts):
    (row,) = HFSampler(model, tokenizer).sample(prompts[:1], 8, max_new_tokens=MAX_NEW, temperature=1.0)
    assert len({tuple(s.token_ids) for s in row}) > 1


def test_shared_prefill_equals_no_sharing(model, tokenizer, prompts):
    batch = [prompts[0], prompts[1], prompts[0]]  # a repeated prompt is prefilled once too
    for temperature, n in [(0.0, 2), (1.0, 3)]:
        kw = dict(max_new_tokens=MAX_NEW, temperature=temperature, seed=5)
        shared = HFSampler(model, tokenizer).sample(batch, n, **kw)
        separate = HFSampler(model, tokenizer, share_prefill=False).sample(batch, n, **kw)
        for r1, r2 in zip(shared, separate, strict=True):
            for s1, s2 in zip(r1, r2, strict=True):
                assert s1.token_ids == s2.token_ids and s1.stop_reason == s2.stop_reason
                torch.testing.assert_close(
                    torch.tensor(s1.logprobs), torch.tensor(s2.logprobs), atol=1e-5, rtol=0
                )


def test_stop_string(model, tokenizer, prompts):
    sampler = HFSampler(model, tokenizer)
    (greedy,) = sampler.sample(prompts[1:2], 1, max_new_tokens=24, temperature=0.0)[0]
    ids = greedy.token_ids
    # a stop string the greedy output contains: two consecutive ASCII bytes, not at the start
    k = next(i for i in range(2, len(ids) - 1) if ids[i] < 128 and ids[i + 1] < 128)
    stop = tokenizer.decode(ids[k : k + 2])
    (s, _) = sampler.sample(prompts[1:2], 2, max_new_tokens=24, temperature=0.0, stop=["@@never@@", stop])[0]
    assert s.stop_reason == "stop"
    assert s.text == greedy.text[: greedy.text.find(stop)]
    assert s.token_ids == ids[: len(s.token_ids)]
    assert stop in tokenizer.decode(s.token_ids) and stop not in tokenizer.decode(s.token_ids[:-1])
    assert len(s.logprobs) == len(s.token_ids)


def test_eos_stop(tokenizer, prompts):
    model = build_preset("nano", tokenizer, seed=0)
    (greedy,) = HFSampler(model, tokenizer).sample(prompts[:1], 1, max_new_tokens=4, temperature=0.0)[0]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, greedy.token_ids[0]]
    out = HFSampler(model, tokenizer).sample(prompts, 2, max_new_tokens=4, temperature=0.0)
    (s, _) = out[0]
    assert s.stop_reason == "eos" and s.token_ids == greedy.token_ids[:1] and s.text == ""
    assert len(s.logprobs) == 1


def test_eos_text_stripped(tokenizer, prompts):
    model = build_preset("nano", tokenizer, seed=0)
    (greedy,) = HFSampler(model, tokenizer).sample(prompts[1:2], 1, max_new_tokens=2, temperature=0.0)[0]
    first, second = greedy.token_ids
    assert first != second  # holds for this seed; otherwise generation stops one token earlier
    model.generation_config.eos_token_id = [second]
    (s,) = HFSampler(model, tokenizer).sample(prompts[1:2], 1, max_new_tokens=MAX_NEW, temperature=0.0)[0]
    assert s.token_ids == [first, second] and s.stop_reason == "eos"
    assert s.text == tokenizer.decode([first], skip_special_tokens=True)


def test_rows_stopping_mid_batch_are_dropped_correctly(tokenizer, prompts):
    """Many stop ids: rows stop at different steps and are dropped from the batch (cache
    compaction); every sample must still match teacher forcing and stop at its first stop id."""
    model = build_preset("nano", tokenizer, seed=0)
    stop_ids = list(range(40, 60))  # ~8% of the mass of this near-uniform random model
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stop_ids]
    out = HFSampler(model, tokenizer).sample(prompts, 8, max_new_tokens=24, temperature=1.0, seed=0)
    stops = {tokenizer.eos_token_id, *stop_ids}
    reasons = [s.stop_reason for r in out for s in r]
    assert "eos" in reasons and "length" in reasons
    for s in (s for r in out for s in r):
        assert not stops & set(s.token_ids[:-1])
        assert (s.token_ids[-1] in stops) == (s.stop_reason == "eos")
    assert_matches_teacher(model, out, 1.0)


def test_length_stop(model, tokenizer, prompts):
    out = HFSampler(model, tokenizer).sample(prompts, 1, max_new_tokens=5, temperature=0.0)
    assert all(r[0].stop_reason == "length" and len(r[0].token_ids) == 5 for r in out)


def test_top_k_top_p_truncate_sampling_not_logprobs(model, tokenizer, prompts):
    sampler = HFSampler(model, tokenizer)
    greedy = sampler.sample(prompts, 1, max_new_tokens=MAX_NEW, temperature=0.0)
    for kw in (dict(top_k=1), dict(top_p=1e-6)):  # a one-token set is greedy
        out = sampler.sample(prompts, 2, max_new_tokens=MAX_NEW, temperature=0.7, **kw)
        assert [[s.token_ids for s in r] for r in out] == [[r[0].token_ids] * 2 for r in greedy]
        assert_matches_teacher(model, out, 0.7)  # logprobs stay those before truncation
    logits_B_V = torch.randn(64, 50)
    token_B, _ = choose_tokens(
        logits_B_V, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0)
    )
    assert (logits_B_V.topk(5).indices == token_B[:, None]).any(-1).all()


def test_rejects_bad_arguments(model, tokenizer, prompts):
    sampler = HFSampler(model, tokenizer)
    assert sampler.sample([], 2, max_new_tokens=MAX_NEW) == []
    for args, kw in [
        ([[]], {}),
        (prompts, dict(temperature=-1.0)),
        (prompts, dict(top_p=0.0)),
        (prompts, dict(top_k=-1)),
        (prompts, dict(max_new_tokens=0)),
    ]:
        with pytest.raises(ValueError):
            sampler.sample(args, 1, **{"max_new_tokens": MAX_NEW, **kw})
    with pytest.raises(ValueError):
        sampler.sample(prompts, 0, max_new_tokens=MAX_NEW)
    with pytest.raises(ValueError):
        HFSampler(model, tokenizer, max_batch_rows=0)


def test_vllm_requests_with_a_stand_in_engine(monkeypatch, prompts):
    """VLLMSampler's requests, against a stand-in `vllm` module (no vLLM on a CPU): one request per
    prompt with seed seeds[i] and n samples; greedy asks for one sample and copies it n times."""
    requests = []

    class FakeLLM:
        def __init__(self, model, **kwargs):
            pass

        def get_tokenizer(self):
            return None

        def generate(self, prompts, sampling_params, use_tqdm):
            requests.append(sampling_params)
            # completion j of a request: one token, seed + j (as vLLM seeds its j-th child), out of order
            return [
                SimpleNamespace(
                    outputs=[
                        SimpleNamespace(
                            index=j,
                            token_ids=[p.seed + j],
                            logprobs=[{p.seed + j: SimpleNamespace(logprob=-0.5)}],
                            text="x",
                            finish_reason="length",
                            stop_reason=None,
                        )
                        for j in reversed(range(p.n))
                    ]
                )
                for p in sampling_params
            ]

    monkeypatch.setitem(
        sys.modules,
        "vllm",
        SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: SimpleNamespace(**kw), __version__="fake"),
    )
    from temper.rollout.vllm_sampler import VLLMSampler

    monkeypatch.setattr(VLLMSampler, "_config_stop_ids", lambda self, model: [])
    sampler = VLLMSampler("unused")
    out = sampler.sample(prompts, 3, max_new_tokens=4, seed=[50, 60, 70])
    assert [(p.seed, p.n) for p in requests[-1]] == [(50, 3), (60, 3), (70, 3)]
    assert [[s.token_ids for s in r] for r in out] == [[[k + j] for j in range(3)] for k in (50, 60, 70)]
    assert out[1][2] == Sample(prompts[1], [62], [-0.5], "x", "length")
    sampler.sample(prompts, 3, max_new_tokens=4, seed=8)
    assert [p.seed for p in requests[-1]] == prompt_seeds(8, 3)
    greedy = sampler.sample(prompts, 3, max_new_tokens=4, temperature=0.0, seed=[50, 60, 70])
    assert [p.n for p in requests[-1]] == [1, 1, 1]
    assert [[s.token_ids for s in r] for r in greedy] == [[[k]] * 3 for k in (50, 60, 70)]
    assert greedy[0][0] is not greedy[0][1]  # copies, not one object three times


@pytest.mark.gpu
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(), reason="needs vLLM and CUDA"
)
def test_vllm_sampler_matches_teacher_forcing(tokenizer, prompts, tmp_path):
    from temper.models import save_model
    from temper.rollout.vllm_sampler import VLLMSampler

    model = build_preset("tiny", tokenizer, seed=0)  # head_dim 32: every vLLM attention backend
    save_model(model, tokenizer, tmp_path / "m")
    sampler = VLLMSampler(tmp_path / "m", dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    out = sampler.sample(prompts, 2, max_new_tokens=MAX_NEW, temperature=0.7, seed=0)
    assert_matches_teacher(model, out, 0.7, tol=1e-3)
    with torch.no_grad():  # an "update": the engine must follow after sync
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sampler.sync(model)
    assert_matches_teacher(model, sampler.sample(prompts, 2, max_new_tokens=MAX_NEW, seed=1), 1.0, tol=1e-3)
