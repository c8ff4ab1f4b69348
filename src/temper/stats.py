"""Estimators and confidence intervals for evaluation. Pure functions on Python numbers."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1 and fig. 3):

        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)

    The product avoids the huge binomials. It is 1 when n - c < k (every k-subset holds a
    correct sample)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927; Brown, Cai & DasGupta
    2001 recommend it over the normal interval for small n or p near 0 or 1):

        p = s / n
        center = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    Returns (center - half, center + half), inside [0, 1]; (0, 1) when n == 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}, {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def mean_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float, float]:
    """Mean with a normal-approximation interval: (m, m - z se, m + z se), where

        m = sum(x) / n,  s^2 = sum((x - m)^2) / (n - 1),  se = s / sqrt(n).

    With one value there is no spread estimate and the interval is (m, m, m)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    m = math.fsum(values) / n
    if n < 2:
        return m, m, m
    s = math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1))
    half = z * s / math.sqrt(n)
    return m, m - half, m + half


def bootstrap_ci(
    values: Sequence[float],
    fn: Callable[[Sequence[float]], float] = lambda xs: math.fsum(xs) / len(xs),
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float]:
    """Percentile bootstrap interval of fn(values) (Efron & Tibshirani 1993, ch. 13): resample
    the values with replacement n_boot times and take the alpha/2 and 1 - alpha/2 quantiles of
    fn over the resamples. Deterministic in `seed`."""
    n = len(values)
    if n == 0 or n_boot < 1:
        raise ValueError("bootstrap_ci needs at least one value and n_boot >= 1")
    rng = random.Random(seed)
    stats = sorted(fn(rng.choices(values, k=n)) for _ in range(n_boot))
    return _quantile(stats, alpha / 2), _quantile(stats, 1 - alpha / 2)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default "linear" method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])
