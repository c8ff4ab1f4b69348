import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from temper.models import build_preset, build_tokenizer
from temper.rollout import Completion, generate
from temper.rollout.generate import left_pad

MAX_NEW = 12


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_preset("nano", tokenizer, seed=0)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["hi", "What is 12 + 345? Reply as `Answer: <x>`."]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for t in texts
    ]


def greedy_reference(model, prompt: list[int], stop: set[int], max_new: int) -> list[int]:
    """Argmax one token at a time on the unpadded prompt, without a KV cache."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            t = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(t)
            ids.append(t)
            if t in stop:
                break
    return out


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_greedy_matches_argmax_loop(model, tokenizer, prompts):
    assert len(prompts[0]) != len(prompts[1])
    eos = tokenizer.eos_token_id
    out = generate(model, tokenizer, prompts, max_new_tokens=MAX_NEW, num_samples=2)
    assert [len(cs) for cs in out] == [2, 2]
    for prompt, (c, c2) in zip(prompts, out, strict=True):
        expected = greedy_reference(model, prompt, {eos}, MAX_NEW)
        assert c.token_ids == expected
        assert c == c2
        # this random model never emits eos in MAX_NEW steps: a length stop
        assert c.stop_reason == "length" and len(c.token_ids) == MAX_NEW
        assert c.text == tokenizer.decode(expected, skip_special_tokens=True)
    # one prompt per batch (no padding) agrees with the padded batch
    assert generate(model, tokenizer, prompts, max_new_tokens=MAX_NEW, batch_size=1) == [
        [cs[0]] for cs in out
    ]


def test_eos_stop(tokenizer, prompts):
    model = build_preset("nano", tokenizer, seed=0)
    eos = tokenizer.eos_token_id
    first = greedy_reference(model, prompts[0], {eos}, 1)[0]
    model.generation_config.eos_token_id = [eos, first]
    out = generate(model, tokenizer, prompts, max_new_tokens=MAX_NEW)
    assert out[0] == [Completion(token_ids=[first], text="", stop_reason="eos")]
    # the other row keeps generating after the first one stopped
    expected = greedy_reference(model, prompts[1], {eos, first}, MAX_NEW)
    assert out[1][0].token_ids == expected
    stopped = expected[-1] in {eos, first}
    assert out[1][0].stop_reason == ("eos" if stopped else "length")
    body = expected[:-1] if stopped else expected
    assert out[1][0].text == tokenizer.decode(body, skip_special_tokens=True)


def test_eos_text_stripped(tokenizer, prompts):
    model = build_preset("nano", tokenizer, seed=0)
    first, second = greedy_reference(model, prompts[1], set(), 2)
    model.generation_config.eos_token_id = [second]
    [[c]] = generate(model, tokenizer, prompts[1:], max_new_tokens=MAX_NEW)
    assert first != second  # holds for this seed; otherwise generation stops one token earlier
    assert c.token_ids == [first, second] and c.stop_reason == "eos"
    assert c.text == tokenizer.decode([first], skip_special_tokens=True)


def test_seeded_sampling(model, tokenizer, prompts):
    model.train()
    before = torch.random.get_rng_state()
    kw = dict(num_samples=3, temperature=1.0, max_new_tokens=8, seed=7)
    a = generate(model, tokenizer, prompts, **kw)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is untouched
    assert model.training  # the mode is restored
    model.eval()
    assert a == generate(model, tokenizer, prompts, **kw)
    assert a != generate(model, tokenizer, prompts, **{**kw, "seed": 8})
    assert [len(cs) for cs in a] == [3, 3]
    assert len({tuple(c.token_ids) for c in a[0]}) > 1  # samples of one prompt differ


def test_tiny_top_p_is_greedy(model, tokenizer, prompts):
    greedy = generate(model, tokenizer, prompts, max_new_tokens=8)
    nucleus = generate(model, tokenizer, prompts, temperature=1.0, top_p=1e-6, max_new_tokens=8)
    assert nucleus == greedy


def test_rejects_bad_arguments(model, tokenizer, prompts):
    assert generate(model, tokenizer, []) == []
    with pytest.raises(ValueError):
        generate(model, tokenizer, [[]])
    with pytest.raises(ValueError):
        generate(model, tokenizer, prompts, temperature=-1.0)
    with pytest.raises(ValueError):
        generate(model, tokenizer, prompts, top_p=0.0)
