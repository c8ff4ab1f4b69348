"""rollout/sampling.py and rollout/sampler.py on hand-computed values: the CDF inversion at its
boundaries (a uniform number exactly on a step, at the top of the CDF, unnormalized weights, a
zero-probability token), the generator the draws come from, and the sampler arguments' refusals
word for word.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

import math

import pytest
import torch

from temper.rollout.sampler import Sample, check_sample_args, with_greedy_copies
from temper.rollout.sampling import _draw, choose_tokens, row_uniforms

# probabilities 1/2, 1/4, 1/8, 1/8: exact in floating point
LOGITS = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))


def test_a_uniform_number_on_a_cdf_step_takes_the_next_token():
    """CDF 0.5, 0.75, 0.875, 1: u = 0.5 lies at the end of token 0's interval [0, 0.5)."""
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]] * 3)
    assert _draw(probs, torch.tensor([0.5, 0.75, 0.0])).tolist() == [1, 2, 0]


def test_a_zero_probability_token_is_never_drawn():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    assert _draw(probs, torch.tensor([0.0])).tolist() == [1]
    assert _draw(probs, torch.tensor([0.5])).tolist() == [3]


def test_unnormalized_weights_are_scaled_by_their_total():
    """weights 1, 1, 2 (total 4): u = 0.5 -> 2 on the CDF 1, 2, 4 -> token 2 (u / 4 would give token 0)."""
    weights = torch.tensor([[1.0, 1.0, 2.0]])
    assert _draw(weights, torch.tensor([0.5])).tolist() == [2]
    assert _draw(weights, torch.tensor([0.4])).tolist() == [1]


def test_the_top_of_the_cdf_takes_each_rows_most_likely_token():
    """u * total at the top of the CDF (rounding can get there) would index past the vocabulary:
    each row then takes its own argmax."""
    probs = torch.tensor([[0.25, 0.5, 0.25], [0.1, 0.2, 0.7]])
    assert _draw(probs, torch.tensor([1.0, 1.0])).tolist() == [1, 2]


def test_the_uniform_number_is_rounded_to_the_probabilities_dtype():
    """a float64 uniform just below 0.5 rounds to 0.5 in float32, so it picks the token a float32
    uniform of that number picks."""
    probs = torch.tensor([[0.5, 0.5]])
    u = torch.tensor([0.5 - 1e-12], dtype=torch.float64)
    assert _draw(probs, u).tolist() == _draw(probs, u.float()).tolist() == [1]


def test_without_uniform_numbers_the_draws_come_from_the_given_generator():
    rows = 6
    expected_u = torch.rand(rows, generator=torch.Generator().manual_seed(7))
    cdf = [0.5, 0.75, 0.875, 1.0]
    expected = [next(i for i, c in enumerate(cdf) if u < c) for u in expected_u.tolist()]
    torch.manual_seed(0)
    state = torch.get_rng_state()
    tokens, logp = choose_tokens(
        LOGITS.repeat(rows, 1), temperature=1.0, generator=torch.Generator().manual_seed(7)
    )
    assert tokens.tolist() == expected
    assert logp.tolist() == pytest.approx([math.log([0.5, 0.25, 0.125, 0.125][t]) for t in expected])
    assert torch.equal(torch.get_rng_state(), state)  # the global generator was not used


def test_sample_arguments_are_refused_word_for_word():
    check_sample_args([[1]], 1, 1, 0.0, 1.0, 0)  # the smallest valid call
    with pytest.raises(ValueError) as err:
        check_sample_args([[1]], 0, 5, 1.0, 1.0, 0)
    assert str(err.value) == "n and max_new_tokens must be >= 1, got 0, 5"
    with pytest.raises(ValueError) as err:
        check_sample_args([[1]], 2, 0, 1.0, 1.0, 0)
    assert str(err.value) == "n and max_new_tokens must be >= 1, got 2, 0"
    with pytest.raises(ValueError) as err:
        check_sample_args([[1]], 1, 1, 1.0, 1.5, 0)
    assert str(err.value) == "need temperature >= 0, 0 < top_p <= 1 and top_k >= 0, got 1.0, 1.5, 0"
    with pytest.raises(ValueError) as err:
        check_sample_args([[1], []], 1, 1, 1.0, 1.0, 0)
    assert str(err.value) == "every prompt needs at least one token"


def test_greedy_copies_are_independent_objects():
    calls = []

    def decode(k):
        calls.append(k)
        return [[Sample([1], [2, 3], [-0.5, -0.25], "ab", "eos")]]

    copies = with_greedy_copies(decode, 3, 0.0)[0]
    assert calls == [1] and len(copies) == 3
    copies[0].token_ids.append(9)
    copies[0].logprobs[0] = 0.0
    assert copies[1].token_ids == [2, 3] and copies[2].logprobs == [-0.5, -0.25]
    assert with_greedy_copies(decode, 3, 0.7) == decode(3) and calls[-2:] == [3, 3]


def test_the_draws_do_not_depend_on_torchs_default_dtype():
    """the uniform numbers are float32 draws of each row's generator even when a caller has made
    float64 torch's default (float64 draws of the same generator are other numbers)."""
    rows = 16
    expected_u = torch.rand(rows, generator=torch.Generator().manual_seed(7))
    cdf = [0.5, 0.75, 0.875, 1.0]
    expected = [next(i for i, c in enumerate(cdf) if u < c) for u in expected_u.tolist()]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        uniforms = row_uniforms([3, 4], 5, torch.device("cpu"))
        tokens, _ = choose_tokens(
            LOGITS.repeat(rows, 1), temperature=1.0, generator=torch.Generator().manual_seed(7)
        )
    finally:
        torch.set_default_dtype(old)
    assert uniforms.dtype == torch.float32
    assert uniforms[1].tolist() == torch.rand(5, generator=torch.Generator().manual_seed(4)).tolist()
    assert tokens.tolist() == expected


# ---- exact cases, folded in from test_rollout_exact.py -----------------------------------------
# The rollout package's pure parts on hand-computed values: which tokens top-p and top-k keep (a
# distribution of halves and quarters, and the uniform number that picks between them), the stop ids
# a sampler stops at, the attention masks per attention kind and dtype, and the slab cache's sizes.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


def _pick(u, rows=1, **kw):
    tokens, logp = choose_tokens(
        LOGITS.repeat(rows, 1), temperature=1.0, uniform_B=torch.full((rows,), u), **kw
    )
    return tokens.tolist(), logp.tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    """top_p 0.75: the tokens before token 2 hold 0.75 already, so only tokens 0 and 1 stay, renormalized
    to 2/3 and 1/3; u = 0.9 falls in token 1's share (in token 3's without truncation)."""
    assert _pick(0.9)[0] == [3]  # untruncated CDF: 0.5, 0.75, 0.875, 1
    tokens, logp = _pick(0.9, rows=2, top_p=0.75)
    assert tokens == [1, 1] and logp == pytest.approx([math.log(0.25)] * 2)  # logprob before truncation
    assert _pick(0.6, top_p=0.75)[0] == [0]  # 0.6 < 2/3
    assert _pick(0.7, top_p=0.75)[0] == [1]
    # top_p 0.8: token 2 (0.75 before it) stays: 4/7, 2/7, 1/7, and 0.9 falls in its share
    assert _pick(0.9, top_p=0.8)[0] == [2]


def test_top_k_keeps_the_k_largest():
    assert _pick(0.9, top_k=2)[0] == [1]  # tokens 0 and 1: 2/3 and 1/3
    assert _pick(0.9, rows=3, top_k=2)[0] == [1, 1, 1]
    assert _pick(0.99, top_k=4)[0] == [3]  # k = vocabulary: nothing dropped
