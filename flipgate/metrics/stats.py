"""Uncertainty of flip and churn rates: Wilson intervals and the exact McNemar test.

scipy.special is imported when a number is first computed, not with the package: the
commands that compute none (`flipgate --help`, `gate`, `policy`) do not wait for it."""

import math


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when there are no trials."""
    if trials == 0:
        return (0.0, 1.0)
    from scipy.special import ndtri

    z = float(ndtri(0.5 + confidence / 2))
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


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
    from scipy.special import bdtrc

    return float(bdtrc(negative_flips - 1, discordant, null_share))  # P(X >= nf)
