"""Compatibility metrics between classifier versions; pure numpy (DESIGN §4)."""

from flipgate.metrics.calibration import confidence_gap, expected_calibration_error
from flipgate.metrics.churn import churn, schurn
from flipgate.metrics.displacement import describe, logit_displacement, rank_in_old
from flipgate.metrics.diversity import prediction_difference
from flipgate.metrics.flips import FlipCounts, count_flips, flipped_indices, per_class
from flipgate.metrics.matrices import pairwise_matrices
from flipgate.metrics.probs import predicted_labels, softmax
from flipgate.metrics.report import compare_logits
from flipgate.metrics.stats import mcnemar_one_sided_p, wilson_interval

__all__ = [
    "FlipCounts",
    "churn",
    "compare_logits",
    "confidence_gap",
    "count_flips",
    "describe",
    "expected_calibration_error",
    "flipped_indices",
    "logit_displacement",
    "mcnemar_one_sided_p",
    "pairwise_matrices",
    "per_class",
    "predicted_labels",
    "prediction_difference",
    "rank_in_old",
    "schurn",
    "softmax",
    "wilson_interval",
]
