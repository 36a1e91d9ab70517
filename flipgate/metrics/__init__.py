"""Compatibility metrics between classifier versions; pure numpy (DESIGN §4)."""

from flipgate.metrics.calibration import confidence_gap, expected_calibration_error
from flipgate.metrics.displacement import describe, logit_displacement, rank_in_old
from flipgate.metrics.diversity import prediction_difference
from flipgate.metrics.flips import FlipCounts, count_flips, flipped_indices, per_class
from flipgate.metrics.matrices import pairwise_matrices
from flipgate.metrics.probs import softmax
from flipgate.metrics.report import compare_logits
from flipgate.metrics.schurn import schurn
from flipgate.metrics.stats import mcnemar_one_sided_p, wilson_interval

__all__ = [
    "FlipCounts",
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
    "prediction_difference",
    "rank_in_old",
    "schurn",
    "softmax",
    "wilson_interval",
]
