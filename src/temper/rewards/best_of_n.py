"""Best-of-N: draw N completions, keep the one a ranker scores highest. Pure functions on Python
numbers (no torch), shared by the eval mode (accuracy vs N) and the SFT data generator.

A ranker is any callable from (prompt ids, completion ids) to one score per completion: the
task's verifier (score = 1 if correct else 0) or a learned reward model
(`temper.rewards.reward_model.RewardModel.score`). Ties are broken by the lower sample index, so a
selection is a pure function of the scores and the draw order.

Accuracy vs N from ONE set of n samples per prompt: draw n = max(N) once and average, over every
size-N subset of those n, the value of the subset's top-ranked sample (`expected_best_of_n`).
Sorting the n samples by (score desc, index asc) gives a total order, and the top of a random
N-subset is the sample at rank r (0-based) exactly when the subset holds it and its N - 1 others
all rank below it:

    P(top of a random N-subset is rank r) = C(n - 1 - r, N - 1) / C(n, N)

so the expectation is exact (no Monte Carlo) and unbiased for best-of-N on fresh draws. Ranked
by the verifier, the top of a subset is correct iff the subset holds a correct sample, and the
sum collapses to Chen et al.'s unbiased pass@N = 1 - C(n - c, N) / C(n, N).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Ranker = Callable[[list[list[int]], list[list[int]]], list[float]]
"""(prompt ids, completion ids) of a batch of completions -> one score each; higher is better."""


def bon_kl(n: int) -> float:
    """The analytic KL of the best-of-n policy from the sampling policy (Stiennon et al. 2020,
    "Learning to summarize from human feedback", appendix G.3; Gao et al. 2022, "Scaling Laws for
    Reward Model Overoptimization", section 2.2):

        KL(pi_bon || pi) = log n - (n - 1) / n

    Exact when the ranker's scores are continuous (no ties, each outcome has probability 0); for
    a discrete distribution it is an upper bound (Beirami et al. 2024, "Theoretical guarantees on
    the best-of-n alignment policy"), computed exactly by `discrete_bon_kl`."""
    if n < 1:
        raise ValueError(f"best-of-n needs n >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def rank_order(scores: Sequence[float]) -> list[int]:
    """Sample indices best first: by score descending, ties by the lower index. A NaN or infinite
    score is an error (a broken reward model must not pick silently)."""
    bad = [i for i, s in enumerate(scores) if not math.isfinite(s)]
    if bad:
        raise ValueError(f"best-of-n: non-finite scores at samples {bad[:5]}: {[scores[i] for i in bad[:5]]}")
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def best_index(scores: Sequence[float]) -> int:
    """The selected sample: the highest score, the lowest index among equal scores."""
    if not scores:
        raise ValueError("best-of-n of no samples")
    return rank_order(scores)[0]


def selection_weights(n: int, size: int) -> list[float]:
    """w_r = C(n - 1 - r, size - 1) / C(n, size), r = 0..n-1: the probability that the sample at
    rank r is the top of a uniformly random size-subset of n ranked samples (sums to 1)."""
    if not 1 <= size <= n:
        raise ValueError(f"best-of-{size} needs 1 <= {size} <= n samples, got n={n}")
    total = math.comb(n, size)
    return [math.comb(n - 1 - r, size - 1) / total for r in range(n)]


def expected_best_of_n(scores: Sequence[float], values: Sequence[float], size: int) -> float:
    """E[values of the top-scored sample of a random size-subset of the samples], exactly:

        sum_r values[order[r]] * C(n - 1 - r, size - 1) / C(n, size)

    with `order` = `rank_order(scores)`. values = correctness gives best-of-size accuracy;
    values = scores gives the ranker's expected best score (the proxy reward)."""
    if len(scores) != len(values):
        raise ValueError(f"{len(scores)} scores for {len(values)} values")
    order = rank_order(scores)
    w = selection_weights(len(scores), size)
    return sum(wr * float(values[i]) for wr, i in zip(w, order, strict=True))


def bon_distribution(p: Sequence[float], scores: Sequence[float], n: int) -> list[float]:
    """The exact distribution of the best-of-n pick over a discrete distribution `p` whose outcome
    i has score `scores[i]`. With F(s) = P(score <= s) under p, the top score of n draws is s with
    probability F(s)^n - F(s-)^n; outcomes sharing that score split it in proportion to p (the
    first drawn of them wins the tie, and which one that is follows p)."""
    if len(p) != len(scores):
        raise ValueError(f"{len(p)} probabilities for {len(scores)} scores")
    by_score: dict[float, float] = {}
    for pi, s in zip(p, scores, strict=True):
        by_score[s] = by_score.get(s, 0.0) + pi
    below, top = 0.0, {}
    for s in sorted(by_score):
        mass = by_score[s]
        top[s] = (below + mass) ** n - below**n
        below += mass
    return [pi * top[s] / by_score[s] if pi else 0.0 for pi, s in zip(p, scores, strict=True)]


def discrete_bon_kl(p: Sequence[float], scores: Sequence[float], n: int) -> float:
    """KL(best-of-n || p) = sum_i q_i log(q_i / p_i), q = `bon_distribution(p, scores, n)`."""
    q = bon_distribution(p, scores, n)
    return sum(qi * math.log(qi / pi) for qi, pi in zip(q, p, strict=True) if qi > 0)
