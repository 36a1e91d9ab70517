"""Uncertainty of flip and churn rates: Wilson intervals and the exact McNemar test.

Computed with the standard library alone (the normal quantile of `statistics`, the binomial
tail as a regularized incomplete beta function): importing scipy would cost every
`flipgate compare` about 0.13 s of its start."""

import math
from statistics import NormalDist

BETA_FRACTION_STEPS = 100_000  # Lentz's method needs about sqrt(n) of them for n trials
TINY = 1e-300  # keeps the continued fraction's terms away from zero


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when there are no trials."""
    if trials == 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact where rounding is not
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return (low, high)


def mcnemar_one_sided_p(negative_flips: int, positive_flips: int) -> float:
    """Exact one-sided McNemar p-value for H0: the update breaks no more samples than it fixes.

    Under H0 each discordant sample is a negative flip with probability 1/2, so the p-value is
    P(X >= negative_flips) for X ~ Binomial(negative_flips + positive_flips, 1/2).
    """
    return cost_mcnemar_one_sided_p(negative_flips, positive_flips, 1.0, 1.0)


def cost_mcnemar_one_sided_p(
    negative_flips: int, positive_flips: int, negative_flip_cost: float, positive_flip_gain: float
) -> float:
    """Exact one-sided p-value for H0: the update does not raise the expected cost.

    The cost per sample is c·[negative flip] − g·[positive flip]. Under H0 (c·P(neg) <= g·P(pos))
    a discordant sample is a negative flip with probability at most g / (c + g), so the p-value
    is P(X >= negative_flips) for X ~ Binomial(negative_flips + positive_flips, g / (c + g)).
    With c = g this is the McNemar test above.
    """
    if negative_flip_cost <= 0 or positive_flip_gain < 0:
        raise ValueError("the negative flip cost must be positive and the positive flip gain "
                         "non-negative")
    discordant = negative_flips + positive_flips
    if discordant == 0 or negative_flips == 0:
        return 1.0
    null_share = positive_flip_gain / (negative_flip_cost + positive_flip_gain)
    return binomial_upper_tail(negative_flips, discordant, null_share)


def binomial_upper_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): the regularized incomplete beta I_p(k, n - k + 1)."""
    if k <= 0 or p >= 1:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    return _regularized_beta(p, k, n - k + 1)


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), from the continued fraction on the side of x where it converges fast."""
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                 + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method."""
    c, d = 1.0, _away_from_zero(1.0 - (a + b) * x / (a + 1))
    d = 1.0 / d
    fraction = d
    for m in range(1, BETA_FRACTION_STEPS):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d, c = 1.0 / _away_from_zero(1.0 + even * d), _away_from_zero(1.0 + even / c)
        fraction *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d, c = 1.0 / _away_from_zero(1.0 + odd * d), _away_from_zero(1.0 + odd / c)
        fraction *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return fraction
    raise ArithmeticError(f"the binomial tail did not converge (a = {a}, b = {b}, x = {x})")


def _away_from_zero(value: float) -> float:
    return value if abs(value) > TINY else TINY
