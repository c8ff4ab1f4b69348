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
