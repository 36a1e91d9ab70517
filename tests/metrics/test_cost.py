"""The expected cost of an update and its one-sided test, against hand-counted flips; a
multi-label update's per-label cost against whole-array numpy on the per-sample costs."""

import numpy as np
import pytest
from scipy.stats import binomtest

from flipgate.metrics import (
    cost_mcnemar_one_sided_p,
    label_update_cost,
    mcnemar_one_sided_p,
    update_cost,
)
from flipgate.metrics.multilabel import compare_multilabel
from tests.multilabel_reference import label_cost


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


def indices(mask: np.ndarray) -> list[np.ndarray]:
    """Per label (column), the samples where `mask` holds."""
    return [np.flatnonzero(column) for column in mask.T]


def test_label_cost_is_numpys_mean_of_per_sample_costs_from_the_reports_flips():
    rng = np.random.default_rng(11)
    y = rng.random((500, 4)) < 0.3
    hit = rng.random(500) < 0.08  # samples whose labels the new version mostly loses
    old = np.where(rng.random((500, 4)) < 0.1, ~y, y)
    new = np.where(hit[:, None] & (rng.random((500, 4)) < 0.7), ~y,
                   np.where(rng.random((500, 4)) < 0.05, y, old))
    report = compare_multilabel(y, old, new, label_names=list("abcd"))
    costs, gains = [5.0, 1.0, 1.0, 0.5], [1.0, 2.0, 1.0, 0.0]
    result = label_update_cost(500, list(report["flipped_indices"].values()),
                               list(report["fixed_indices"].values()), costs=costs, gains=gains)
    expected = label_cost(y, old, new, costs, gains)
    assert result.cost == pytest.approx(expected["expected_cost"]) and result.cost > 0
    assert result.interval == pytest.approx(tuple(expected["expected_cost_ci"]))
    assert result.p_value == pytest.approx(expected["cost_p"])
    assert result.per_label == pytest.approx(tuple(expected["per_label"]))
    assert sum(result.per_label) == pytest.approx(result.cost)


def naive_pairs_interval(negative, positive, costs, gains) -> tuple[float, float]:
    """The interval that takes the N·L (sample, label) pairs as independent: L times the
    normal interval of the mean cost per pair."""
    n, labels = negative.shape
    per_pair = (negative * np.asarray(costs) - positive * np.asarray(gains)).ravel()
    half = 1.959963984540054 * per_pair.std(ddof=1) / np.sqrt(n * labels)
    return labels * (per_pair.mean() - half), labels * (per_pair.mean() + half)


def test_a_sample_whose_two_labels_flip_counts_once_as_a_cluster():
    """Ten of 100 samples lose both labels, or ten lose one and ten others the other: the
    same flips per label, so the same cost and the same naive interval over pairs; the
    clustered interval is wider where the flips share samples, narrower where they do not."""
    together, apart = np.zeros((100, 2), bool), np.zeros((100, 2), bool)
    together[:10] = True
    apart[:10, 0] = apart[10:20, 1] = True
    none = np.zeros_like(together)
    widths = {}
    for name, negative in (("together", together), ("apart", apart)):
        result = label_update_cost(100, indices(negative), indices(none), costs=[1, 1],
                                   gains=[1, 1])
        low, high = label_cost(none, none, negative, [1, 1], [1, 1])["expected_cost_ci"]
        assert result.cost == pytest.approx(0.2)
        assert result.interval == pytest.approx((low, high))
        naive = naive_pairs_interval(negative, none, [1, 1], [1, 1])
        widths[name] = (high - low, naive[1] - naive[0])
    assert widths["together"][1] == pytest.approx(widths["apart"][1])
    assert widths["together"][0] > 1.3 * widths["together"][1]
    assert widths["apart"][0] < widths["apart"][1]


def test_the_clustered_interval_covers_the_true_cost_where_pairs_would_not():
    """Labels that flip together: the interval over samples covers the true cost about 95%
    of the time, the one over independent pairs clearly less often."""
    rng = np.random.default_rng(3)
    n, labels, p_hit, p_fix, costs, gains = 300, 4, 0.05, 0.03, [2.0, 1, 1, 1], [1.0, 1, 1, 1]
    true_cost = p_hit * sum(costs) - p_fix * sum(gains)
    covered = {"samples": 0, "pairs": 0}
    draws = 1000
    for _ in range(draws):
        kind = rng.choice(3, size=n, p=[p_hit, p_fix, 1 - p_hit - p_fix])
        negative = np.repeat((kind == 0)[:, None], labels, axis=1)
        positive = np.repeat((kind == 1)[:, None], labels, axis=1)
        low, high = label_update_cost(n, indices(negative), indices(positive), costs=costs,
                                      gains=gains).interval
        covered["samples"] += low <= true_cost <= high
        low, high = naive_pairs_interval(negative, positive, costs, gains)
        covered["pairs"] += low <= true_cost <= high
    assert 0.93 <= covered["samples"] / draws <= 0.97
    assert covered["pairs"] / draws < 0.85


def test_gains_above_costs_are_not_significant_and_no_flip_costs_nothing():
    fixed = label_update_cost(50, [[0]], [[1, 2, 3]], costs=[1], gains=[1])
    assert fixed.cost == pytest.approx(-2 / 50) and fixed.p_value > 0.5
    calm = label_update_cost(50, [[], []], [[], []], costs=[1, 1], gains=[1, 1])
    assert (calm.cost, calm.interval, calm.p_value, calm.per_label) == (
        0.0, (0.0, 0.0), 1.0, (0.0, 0.0))


@pytest.mark.parametrize("costs, gains", [([-1.0], [1.0]), ([float("nan")], [1.0]),
                                          ([1.0], [float("nan")]), ([1.0, 1.0], [1.0])])
def test_bad_label_costs_are_refused(costs, gains):
    with pytest.raises(ValueError, match="one non-negative cost and gain per label"):
        label_update_cost(10, [[1]], [[2]], costs=costs, gains=gains)
