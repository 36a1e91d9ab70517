"""The expected cost of an update: negative flips cost, positive flips earn (docs/metrics.md)."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from flipgate.metrics.stats import cost_mcnemar_one_sided_p, wilson_interval


@dataclass(frozen=True)
class UpdateCost:
    """cost = (c·NF − g·PF) / N per sample, its interval, and the one-sided test's p-value."""

    cost: float
    interval: tuple[float, float]
    p_value: float

    def to_dict(self) -> dict:
        return {"cost": self.cost, "cost_ci": list(self.interval), "cost_p": self.p_value}


def update_cost(
    negative_flips: int, positive_flips: int, n: int, *, negative_flip_cost: float = 1.0,
    positive_flip_gain: float = 1.0, confidence: float = 0.95,
) -> UpdateCost:
    """Expected cost per sample of replacing the old model by the new one on n samples.

    The interval is MOVER (Zou & Donner 2008, "method of variance estimates recovery") for the
    linear combination c·NFR − g·PFR, built from the Wilson intervals of NFR and PFR and the
    multinomial correlation between them; the p-value is `cost_mcnemar_one_sided_p`.
    """
    if n < 1 or negative_flips < 0 or positive_flips < 0 or negative_flips + positive_flips > n:
        raise ValueError(f"flip counts {negative_flips} and {positive_flips} do not fit {n} "
                         "samples")
    p_value = cost_mcnemar_one_sided_p(negative_flips, positive_flips, negative_flip_cost,
                                       positive_flip_gain)
    nfr, pfr = negative_flips / n, positive_flips / n
    cost_part = _scaled_interval(nfr, wilson_interval(negative_flips, n, confidence),
                                 negative_flip_cost)
    gain_part = _scaled_interval(pfr, wilson_interval(positive_flips, n, confidence),
                                 -positive_flip_gain)
    # Var(c·NFR − g·PFR) gains 2·c·g·Cov-term: NFR and PFR are negatively correlated.
    correlation = _negative_correlation(nfr, pfr)
    cost = negative_flip_cost * nfr - positive_flip_gain * pfr
    return UpdateCost(cost, _mover(cost, cost_part, gain_part, correlation), p_value)


def _scaled_interval(
    rate: float, interval: tuple[float, float], weight: float
) -> tuple[float, float, float]:
    """(estimate, low, high) of weight·rate from an interval of rate."""
    ends = sorted((weight * interval[0], weight * interval[1]))
    return weight * rate, ends[0], ends[1]


def _negative_correlation(nfr: float, pfr: float) -> float:
    """−corr(NFR, PFR) under the multinomial model, 0 when a rate is 0 or 1."""
    denominator = (1 - nfr) * (1 - pfr)
    return math.sqrt(nfr * pfr / denominator) if denominator > 0 else 0.0


def _mover(
    estimate: float, first: tuple[float, float, float], second: tuple[float, float, float],
    correlation: float,
) -> tuple[float, float]:
    """MOVER limits of first + second whose estimates are correlated by `correlation`."""
    (a, a_low, a_high), (b, b_low, b_high) = first, second
    below = (a - a_low) ** 2 + (b - b_low) ** 2 + 2 * correlation * (a - a_low) * (b - b_low)
    above = (a_high - a) ** 2 + (b_high - b) ** 2 + 2 * correlation * (a_high - a) * (b_high - b)
    return estimate - math.sqrt(max(below, 0.0)), estimate + math.sqrt(max(above, 0.0))


@dataclass(frozen=True)
class LabelUpdateCost(UpdateCost):
    """A multi-label update's cost per sample, with each label's share of it (they sum to
    `cost`)."""

    per_label: tuple[float, ...]


def label_update_cost(
    n: int, negative_flips: Sequence[Sequence[int]], positive_flips: Sequence[Sequence[int]],
    *, costs: Sequence[float], gains: Sequence[float], confidence: float = 0.95,
) -> LabelUpdateCost:
    """Expected cost per sample of a multi-label update: Σ_j (costs[j]·NF_j − gains[j]·PF_j)
    / n, from each label's negative and positive flips (sample indices, distinct per label).

    The labels of one sample move together, so the samples are the clusters: the interval is
    the normal one on the mean of the per-sample costs c_i = Σ_j (costs[j]·nf_ij −
    gains[j]·pf_ij) with their sample standard deviation, and the p-value the one-sided z
    test of H0 "the update does not raise the expected cost" (mean c ≤ 0).
    """
    weights = [np.asarray(values, dtype=np.float64) for values in (costs, gains)]
    if any(weight.shape != (len(negative_flips),) or not np.all(weight >= 0)
           for weight in weights) or len(positive_flips) != len(negative_flips) or n < 1:
        raise ValueError("one non-negative cost and gain per label, and n >= 1, are needed")
    contributions = sample_costs(n, negative_flips, positive_flips, *weights)
    cost = float(contributions.mean())
    error = float(contributions.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * error
    per_label = tuple((cost_j * len(nf) - gain_j * len(pf)) / n for nf, pf, cost_j, gain_j
                      in zip(negative_flips, positive_flips, *weights, strict=True))
    return LabelUpdateCost(cost, (cost - half, cost + half), _upper_z_p(cost, error),
                           per_label)


def sample_costs(n: int, negative_flips: Sequence[Sequence[int]],
                 positive_flips: Sequence[Sequence[int]], costs: np.ndarray,
                 gains: np.ndarray) -> np.ndarray:
    """Each sample's cost c_i = Σ_j (costs[j]·nf_ij − gains[j]·pf_ij), shape (n,)."""
    contributions = np.zeros(n)
    for flips, weights in ((negative_flips, costs), (positive_flips, -gains)):
        for indices, weight in zip(flips, weights, strict=True):
            contributions[np.asarray(indices, dtype=np.int64)] += weight
    return contributions


def _upper_z_p(mean: float, error: float) -> float:
    """P(Z >= mean / error) under H0 mean <= 0; with no spread, 0 above 0 and 1 otherwise."""
    if error == 0:
        return 0.0 if mean > 0 else 1.0
    return NormalDist().cdf(-mean / error)
