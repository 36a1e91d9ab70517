"""The binomial tail behind the McNemar tests, against exact rational arithmetic and scipy."""

from fractions import Fraction
from math import comb

import pytest
from scipy.special import bdtrc

from flipgate.metrics.stats import binomial_upper_tail


def exact_upper_tail(k: int, n: int, p: Fraction) -> Fraction:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly."""
    return sum((comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1)), Fraction(0))


@pytest.mark.parametrize("p", [Fraction(1, 2), Fraction(1, 5), Fraction(4, 5), Fraction(1, 3),
                               Fraction(1, 100)])
@pytest.mark.parametrize("n", [1, 2, 7, 40, 301])
def test_the_tail_equals_the_exact_sum(n, p):
    for k in sorted({0, 1, n // 3, n // 2, int(n * p), int(n * p) + 1, n - 1, n, n + 1}):
        exact = float(exact_upper_tail(k, n, p)) if k <= n else 0.0
        assert binomial_upper_tail(k, n, float(p)) == pytest.approx(exact, rel=1e-11, abs=1e-300)


@pytest.mark.parametrize(("k", "n", "p"), [(50_001, 100_000, 0.5), (5_100, 10_000, 0.5),
                                           (200_000, 1_000_000, 0.2), (60, 100_000, 0.001)])
def test_large_counts_agree_with_scipy(k, n, p):
    assert binomial_upper_tail(k, n, p) == pytest.approx(float(bdtrc(k - 1, n, p)), rel=1e-8)
