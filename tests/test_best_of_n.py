import itertools
import math
import random
from collections import Counter

import pytest

from temper.rewards.best_of_n import (
    best_index,
    bon_distribution,
    bon_kl,
    discrete_bon_kl,
    expected_best_of_n,
    rank_order,
    selection_weights,
)
from temper.stats import pass_at_k


def test_bon_kl_by_hand():
    assert bon_kl(1) == 0.0
    assert bon_kl(2) == pytest.approx(0.6931471805599453 - 0.5, abs=1e-15)
    assert bon_kl(4) == pytest.approx(1.3862943611198906 - 0.75, abs=1e-15)
    assert bon_kl(16) == pytest.approx(2.772588722239781 - 15 / 16, abs=1e-15)
    with pytest.raises(ValueError):
        bon_kl(0)


def test_ties_break_to_the_lower_index():
    assert rank_order([0.5, 2.0, 2.0, -1.0, 0.5]) == [1, 2, 0, 4, 3]
    assert best_index([1.0, 3.0, 3.0]) == 1
    assert best_index([0.0, 0.0, 0.0]) == 0
    with pytest.raises(ValueError, match="non-finite"):
        best_index([1.0, float("nan")])


def simulate(p, scores, n, trials, seed=0):
    """Best-of-n picks drawn for real: n outcomes from p, the pick by `best_index` on their scores."""
    rng = random.Random(seed)
    outcomes = range(len(p))
    picks = Counter()
    for _ in range(trials):
        draw = rng.choices(outcomes, weights=p, k=n)
        picks[draw[best_index([scores[x] for x in draw])]] += 1
    return [picks[i] / trials for i in outcomes]


@pytest.mark.parametrize(
    "scores",
    [[0.3, -1.0, 2.0, 0.9, 1.5], [1.0, 1.0, 0.0, 2.0, 0.0]],  # distinct; with ties
)
def test_monte_carlo_best_of_n_on_a_small_discrete_distribution(scores):
    p, n, trials = [0.1, 0.2, 0.3, 0.15, 0.25], 4, 100_000
    q_mc = simulate(p, scores, n, trials)
    q = bon_distribution(p, scores, n)
    assert sum(q) == pytest.approx(1.0, abs=1e-12)
    for qi, qi_mc in zip(q, q_mc):  # each frequency within 5 standard errors
        assert abs(qi_mc - qi) < 5 * math.sqrt(qi * (1 - qi) / trials) + 1e-9
    kl_mc = sum(f * math.log(f / pi) for f, pi in zip(q_mc, p) if f)
    assert kl_mc == pytest.approx(discrete_bon_kl(p, scores, n), abs=0.01)
    # a discrete distribution has KL below the analytic (continuous) value
    assert discrete_bon_kl(p, scores, n) < bon_kl(n)


def test_monte_carlo_kl_reaches_the_analytic_value_as_atoms_become_many():
    """Uniform over many atoms with distinct scores is nearly continuous: the Monte-Carlo KL of the
    simulated picks, E_pick[log q(x) / p(x)], approaches log n - (n - 1)/n."""
    atoms, n, trials = 4000, 8, 40_000
    p, scores = [1 / atoms] * atoms, list(range(atoms))
    q = bon_distribution(p, scores, n)
    rng = random.Random(1)
    logs = []
    for _ in range(trials):
        draw = [rng.randrange(atoms) for _ in range(n)]
        x = draw[best_index([scores[d] for d in draw])]
        logs.append(math.log(q[x] / p[x]))
    mean = sum(logs) / trials
    se = math.sqrt(sum((v - mean) ** 2 for v in logs) / (trials - 1) / trials)
    assert abs(mean - bon_kl(n)) < 4 * se + 1e-3
    assert discrete_bon_kl(p, scores, n) == pytest.approx(bon_kl(n), abs=2e-3)


def brute_force(scores, values, size):
    """Mean over every size-subset (in index order) of the value of its `best_index` pick."""
    subsets = list(itertools.combinations(range(len(scores)), size))
    total = sum(values[s[best_index([scores[i] for i in s])]] for s in subsets)
    return total / len(subsets)


def test_exact_subset_estimator_matches_brute_force_enumeration():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 9)
        scores = [float(rng.randint(0, 3)) if rng.random() < 0.5 else rng.gauss(0, 1) for _ in range(n)]
        values = [float(rng.random() < 0.5) for _ in range(n)]
        for size in range(1, n + 1):
            assert expected_best_of_n(scores, values, size) == pytest.approx(
                brute_force(scores, values, size), abs=1e-12
            ), (scores, values, size)


def test_verifier_ranking_is_unbiased_pass_at_n():
    rng = random.Random(2)
    for n in (1, 4, 16):
        for _ in range(10):
            correct = [float(rng.random() < 0.3) for _ in range(n)]
            for size in range(1, n + 1):
                assert expected_best_of_n(correct, correct, size) == pytest.approx(
                    pass_at_k(n, int(sum(correct)), size), abs=1e-12
                )


def test_selection_weights():
    assert selection_weights(4, 1) == [0.25] * 4
    assert selection_weights(4, 4) == [1.0, 0.0, 0.0, 0.0]
    assert selection_weights(4, 2) == pytest.approx([3 / 6, 2 / 6, 1 / 6, 0.0])
    assert sum(selection_weights(16, 5)) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError):
        selection_weights(4, 5)
