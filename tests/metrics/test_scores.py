"""Probability-based metrics and statistics against numbers computed by hand."""

import math

import numpy as np
import pytest

from flipgate.metrics import (
    compare_logits,
    confidence_gap,
    describe,
    expected_calibration_error,
    logit_displacement,
    mcnemar_one_sided_p,
    prediction_difference,
    rank_in_old,
    schurn,
    wilson_interval,
)

from .test_flips import LABELS, NEW, OLD


def test_schurn_by_hand():
    uniform = np.array([[0.0, 0.0]])  # p = (.5, .5) -> scaled (1, 1)
    skewed = np.array([[math.log(3), 0.0]])  # p = (.75, .25) -> scaled (1, 1/3)
    assert schurn(uniform, skewed) == pytest.approx(0.5 * (2 / 3))
    assert schurn(uniform, skewed, alpha=2) == pytest.approx(0.5 * (8 / 9))
    assert schurn(skewed, skewed) == 0
    with pytest.raises(ValueError, match="alpha must be positive"):
        schurn(uniform, skewed, alpha=0)


def test_confidence_gap_and_ece_by_hand():
    assert confidence_gap(np.array([[0.9, 0.1]])) == pytest.approx([0.8])
    assert confidence_gap(np.array([[0.2, 0.5, 0.3]])) == pytest.approx([0.2])
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.35, 0.65], [0.25, 0.75]])
    labels = np.array([0, 1, 1, 0])
    # bins of width 1/15: the two 0.9s share one bin (|1 - .9 + 0 - .9| = .8),
    # 0.65 is right (.35) and 0.75 is wrong (.75), each alone in its bin
    assert expected_calibration_error(probs, labels) == pytest.approx((0.8 + 0.35 + 0.75) / 4)


def test_prediction_difference_by_hand():
    probs = np.array([[[0.8, 0.2]], [[0.4, 0.6]]])  # 2 models, 1 sample, mean (.6, .4)
    result = prediction_difference(probs, np.array([0]))
    assert result["delta_1"] == pytest.approx(0.4)
    assert result["delta_2"] == pytest.approx(math.sqrt(0.08))
    assert result["delta_l1"] == pytest.approx(0.2 / 0.6)
    assert result["delta_h"] == 1.0
    with pytest.raises(ValueError, match="M >= 2"):
        prediction_difference(probs[:1], np.array([0]))


def test_displacement_and_rank_by_hand():
    assert logit_displacement(np.zeros((1, 2)), np.array([[3.0, 4.0]])) == pytest.approx([5.0])
    old = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 1.0]])
    assert rank_in_old(old, np.array([2, 0]), np.array([0, 1])).tolist() == [2, 3]
    assert describe(np.array([1.0, 2.0, 3.0]))["median"] == 2.0
    assert describe(np.array([]))["mean"] is None


def test_wilson_interval_matches_published_values():
    low, high = wilson_interval(2, 10)
    assert (low, high) == pytest.approx((0.0567, 0.5098), abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0 and wilson_interval(0, 10)[1] == pytest.approx(
        0.2775, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_exact_one_sided_by_hand():
    assert mcnemar_one_sided_p(5, 0) == pytest.approx(1 / 32)  # all 5 discordant are regressions
    assert mcnemar_one_sided_p(2, 2) == pytest.approx(11 / 16)  # P(X >= 2), X ~ Bin(4, 1/2)
    assert mcnemar_one_sided_p(0, 3) == 1.0
    assert mcnemar_one_sided_p(0, 0) == 1.0


def test_compare_logits_assembles_the_hand_case():
    eye = np.eye(3)
    report = compare_logits(eye[OLD] * 4, eye[NEW] * 4, LABELS)
    assert (report["n"], report["num_classes"]) == (10, 3)
    assert (report["negative_flips"], report["positive_flips"]) == (2, 2)
    assert report["nfr"] == pytest.approx(0.2) and report["churn"] == pytest.approx(0.5)
    assert report["nfr_ci"] == pytest.approx([0.0567, 0.5098], abs=1e-4)
    assert report["mcnemar_p"] == pytest.approx(11 / 16)
    assert report["flipped_indices"] == {"negative": [2, 3], "positive": [4, 5]}
    # each negative flip moved one-hot logits from the true class to another: ‖Δz‖ = 4·√2
    assert report["displacement"]["negative_flips"]["mean"] == pytest.approx(4 * math.sqrt(2))
    assert report["displacement"]["kept"]["max"] == 0
    assert report["flip_rank"]["counts"] == {"2": 2}  # tied second in the old one-hot logits
    with pytest.raises(ValueError, match="must share one \\(N, C\\) shape"):
        compare_logits(eye[OLD], np.eye(4)[NEW], LABELS)
    with pytest.raises(ValueError, match="labels must lie in \\[0, 3\\)"):
        compare_logits(eye[OLD], eye[NEW], LABELS + 1)
