"""Uncertainty of flip and churn rates: Wilson intervals and the exact McNemar test."""

import math

from scipy.special import bdtrc, ndtri


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when there are no trials."""
    if trials == 0:
        return (0.0, 1.0)
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
    discordant = negative_flips + positive_flips
    if discordant == 0:
        return 1.0
    if negative_flips == 0:
        return 1.0
    return float(bdtrc(negative_flips - 1, discordant, 0.5))  # P(X > nf - 1) = P(X >= nf)
