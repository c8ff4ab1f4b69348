"""HFSampler and the fast decode step on exact values, with a "successor" Llama whose next token is
a fixed function of the current one (one-hot embeddings, attention and MLP outputs zeroed, an
lm_head that puts logit 20 on the successor): every generated id, stop reason and logprob is known
in advance, and the model forwards the sampler makes (prefill widths, decode batch sizes, padding,
masks) are recorded and checked. Also the refusals word for word, the fast step's refusal of every
model it does not reproduce, and the stop-string cut of a finished sample.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

import copy
import functools
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from temper.rollout import HFSampler, stop_ids
from temper.rollout.fast_decode import LlamaDecodeStep

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
