import math

import pytest

from temper.stats import bootstrap_ci, mean_ci, pass_at_k, wilson_interval


def closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
    "n,c,k",
    [
        (10, 0, 1),
        (10, 0, 5),
        (10, 10, 3),
        (10, 3, 1),
        (10, 3, 5),
        (10, 3, 8),
        (4, 1, 4),
        (200, 17, 10),
        (200, 1, 100),
        (5, 2, 3),
        (5, 2, 4),
        (1, 1, 1),
        (1, 0, 1),
    ],
)
def test_pass_at_k_matches_binomials(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12)


def test_pass_at_k_special_cases():
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(8, 8, 4) == 1.0
    assert pass_at_k(8, 5, 4) == 1.0  # n - c = 3 < k: every 4-subset has a correct sample
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_wilson_hand_computed():
    # s=8, n=10, z=1.96: p=0.8, denom=1.38416, center=0.71674, half=0.22658
    lo, hi = wilson_interval(8, 10, 1.96)
    assert lo == pytest.approx(0.49016, abs=1e-4)
    assert hi == pytest.approx(0.94332, abs=1e-4)
    # s=0, n=10: lo = 0, hi = z^2/n / (1 + z^2/n) = 0.38416 / 1.38416
    lo, hi = wilson_interval(0, 10, 1.96)
    assert lo == pytest.approx(0.0, abs=1e-12)
    assert hi == pytest.approx(0.38416 / 1.38416, abs=1e-9)
    lo, hi = wilson_interval(10, 10, 1.96)
    assert lo == pytest.approx(1 - 0.38416 / 1.38416, abs=1e-9)
    assert hi == pytest.approx(1.0, abs=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_symmetric_at_half():
    lo, hi = wilson_interval(50, 100, 1.96)
    assert 0.5 - lo == pytest.approx(hi - 0.5)
    assert lo == pytest.approx(0.40383, abs=1e-4)


def test_mean_ci():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0, 4.0], z=2.0)
    # s = sqrt(5/3), se = s / 2
    assert m == 2.5
    assert hi - m == pytest.approx(2.0 * math.sqrt(5 / 3) / 2)
    assert m - lo == pytest.approx(hi - m)
    assert mean_ci([3.0]) == (3.0, 3.0, 3.0)
    assert mean_ci([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        mean_ci([])


def test_bootstrap_ci():
    values = [0.0] * 30 + [1.0] * 70
    lo, hi = bootstrap_ci(values, n_boot=500, seed=1)
    assert lo < 0.7 < hi
    assert (lo, hi) == bootstrap_ci(values, n_boot=500, seed=1)
    # close to the normal interval for a mean of 100 values
    _, nlo, nhi = mean_ci(values)
    assert lo == pytest.approx(nlo, abs=0.03) and hi == pytest.approx(nhi, abs=0.03)
    assert bootstrap_ci([2.0, 2.0], fn=max, n_boot=10) == (2.0, 2.0)


# ---- exact edges (each assertion below failed on a mutant of temper/stats.py; TESTING.md) ----


def test_invalid_arguments_name_the_bound_they_break():
    with pytest.raises(ValueError, match=r"need 0 <= c <= n and 1 <= k <= n, got n=4, c=5, k=1"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match=r"need 0 <= successes <= n, got 3, 2"):
        wilson_interval(3, 2)
    with pytest.raises(ValueError, match=r"^mean_ci needs at least one value$"):
        mean_ci([])
    with pytest.raises(ValueError, match=r"^bootstrap_ci needs at least one value and n_boot >= 1$"):
        bootstrap_ci([], n_boot=10)
    with pytest.raises(ValueError, match=r"n_boot >= 1"):
        bootstrap_ci([1.0, 2.0], n_boot=0)


def test_wilson_default_z_is_1_96_and_the_upper_end_is_clipped_at_one():
    assert wilson_interval(8, 10) == wilson_interval(8, 10, 1.96)
    # s = n = 5: center + half is 1 in exact arithmetic and 1.0000000000000002 in floats
    assert wilson_interval(5, 5)[1] == 1.0


def test_mean_ci_of_two_values_has_a_spread():
    # m = 2, s = sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt(2), se = s / sqrt(2) = 1
    m, lo, hi = mean_ci([1.0, 3.0], z=1.0)
    assert m == 2.0
    assert lo == pytest.approx(1.0, abs=1e-12) and hi == pytest.approx(3.0, abs=1e-12)


def test_quantile_interpolates_between_order_statistics_like_numpy_linear():
    from temper.stats import _quantile

    xs = [10.0, 20.0, 30.0, 40.0]
    assert _quantile(xs, 0.5) == 25.0  # pos 1.5
    assert _quantile(xs, 0.9) == pytest.approx(37.0)  # pos 2.7: between the last two
    assert _quantile(xs, 1.0) == 40.0  # pos 3: the last one, no index past the end
    assert _quantile(xs, 0.0) == 10.0
    assert _quantile([7.0], 0.3) == 7.0


def test_bootstrap_ci_is_the_quantiles_of_fn_over_seeded_resamples():
    import random

    values = [1.0, 2.0, 4.0, 8.0, 16.0]  # distinct subset sums: every resample statistic differs
    rng = random.Random(3)
    stats = sorted(sum(rng.choices(values, k=5)) for _ in range(5))
    # alpha = 0.5 -> quantiles 0.25 and 0.75 of 5 order statistics: positions 1 and 3 exactly
    assert bootstrap_ci(values, fn=sum, n_boot=5, seed=3, alpha=0.5) == (stats[1], stats[3])
    # the defaults are n_boot=1000, seed=0, alpha=0.05
    assert bootstrap_ci(values) == bootstrap_ci(values, n_boot=1000, seed=0, alpha=0.05)
    many = [float(2**i) for i in range(12)]  # 12 values: resample means rarely tie
    assert bootstrap_ci(many) == bootstrap_ci(many, n_boot=1000, seed=0, alpha=0.05)
    assert bootstrap_ci(many, n_boot=1000) != bootstrap_ci(many, n_boot=1001)
    assert bootstrap_ci(many, seed=0) != bootstrap_ci(many, seed=1)
    # one value, one resample: both ends are that statistic
    assert bootstrap_ci([5.0]) == (5.0, 5.0)
    one = bootstrap_ci([1.0, 2.0], fn=sum, n_boot=1, seed=0)
    assert one[0] == one[1] and one[0] in (2.0, 3.0, 4.0)
