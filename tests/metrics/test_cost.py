"""The expected cost of an update and its one-sided test, against hand-counted flips."""

import numpy as np
import pytest
from scipy.stats import binomtest

from flipgate.metrics import cost_mcnemar_one_sided_p, mcnemar_one_sided_p, update_cost


def test_cost_and_p_value_by_hand():
    # 3 negative and 1 positive flip among 10 samples; a negative flip costs 10, a fix earns 1.
    result = update_cost(3, 1, 10, negative_flip_cost=10, positive_flip_gain=1)
    assert result.cost == pytest.approx((10 * 3 - 1 * 1) / 10)
    # Under H0 a discordant sample is a negative flip with probability 1/11:
    # P(X >= 3), X ~ Bin(4, 1/11) = 4·(1/11)³·(10/11) + (1/11)⁴ = 41 / 14641.
    assert result.p_value == pytest.approx(41 / 14641)
    assert result.interval[0] < result.cost < result.interval[1]
    assert result.to_dict() == {"cost": result.cost, "cost_ci": list(result.interval),
                                "cost_p": result.p_value}


def test_equal_costs_reduce_to_mcnemar():
    for negative, positive in [(5, 0), (2, 2), (0, 3), (0, 0), (40, 25)]:
        assert cost_mcnemar_one_sided_p(negative, positive, 1.0, 1.0) == mcnemar_one_sided_p(
            negative, positive)
        assert cost_mcnemar_one_sided_p(negative, positive, 4.0, 4.0) == pytest.approx(
            mcnemar_one_sided_p(negative, positive))


def test_p_value_is_the_exact_binomial_tail():
    for negative, positive, cost, gain in [(7, 30, 5, 1), (12, 3, 1, 2), (1, 0, 3, 1)]:
        expected = binomtest(negative, negative + positive, gain / (cost + gain),
                             alternative="greater").pvalue
        assert cost_mcnemar_one_sided_p(negative, positive, cost, gain) == pytest.approx(expected)


def test_a_fix_that_earns_nothing_never_offsets_a_break():
    result = update_cost(1, 50, 100, negative_flip_cost=1, positive_flip_gain=0)
    assert result.cost == pytest.approx(0.01)
    # H0 "no higher expected cost" allows no negative flip at all when fixes earn nothing:
    # P(X >= 1) for X ~ Bin(51, 0) is 0.
    assert result.p_value == 0.0
    assert result.interval[0] <= 0.01 <= result.interval[1]


def test_interval_covers_the_true_cost_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    n, p_negative, p_positive, cost, gain = 500, 0.05, 0.03, 3.0, 1.0
    true_cost = cost * p_negative - gain * p_positive
    draws = rng.multinomial(n, [p_negative, p_positive, 1 - p_negative - p_positive], 2000)
    covered = [low <= true_cost <= high for low, high in (
        update_cost(int(nf), int(pf), n, negative_flip_cost=cost,
                    positive_flip_gain=gain).interval for nf, pf, _ in draws)]
    assert 0.93 <= np.mean(covered) <= 0.97


def test_bad_counts_and_costs_are_refused():
    with pytest.raises(ValueError, match="do not fit 10 samples"):
        update_cost(8, 3, 10)
    with pytest.raises(ValueError, match="negative flip cost must be positive"):
        update_cost(1, 1, 10, negative_flip_cost=0)
