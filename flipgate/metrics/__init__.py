"""Compatibility metrics between classifier versions (docs/metrics.md); numpy, plus ONNX Runtime for
the per-chunk passes of the pair report."""

from flipgate.metrics.calibration import confidence_gap, expected_calibration_error
from flipgate.metrics.cost import LabelUpdateCost, UpdateCost, label_update_cost, update_cost
from flipgate.metrics.displacement import describe, logit_displacement, rank_in_old
from flipgate.metrics.diversity import prediction_difference
from flipgate.metrics.flips import FlipCounts, SliceCounts, count_flips, flipped_indices, per_class
from flipgate.metrics.matrices import (
    PairCountMatrices,
    class_dtype,
    label_pair_count_matrices,
    matrices_from_predictions,
    pair_count_matrices,
    pairwise_matrices,
    predicted_classes,
)
from flipgate.metrics.probs import softmax
from flipgate.metrics.report import PlotValues, compare_labels, compare_logits, measure_pair
from flipgate.metrics.schurn import schurn
from flipgate.metrics.stats import (
    cost_mcnemar_one_sided_p,
    mcnemar_one_sided_p,
    wilson_interval,
)

__all__ = [
    "FlipCounts",
    "LabelUpdateCost",
    "PairCountMatrices",
    "PlotValues",
    "SliceCounts",
    "UpdateCost",
    "class_dtype",
    "compare_labels",
    "compare_logits",
    "confidence_gap",
    "cost_mcnemar_one_sided_p",
    "count_flips",
    "describe",
    "expected_calibration_error",
    "flipped_indices",
    "label_pair_count_matrices",
    "label_update_cost",
    "logit_displacement",
    "matrices_from_predictions",
    "mcnemar_one_sided_p",
    "measure_pair",
    "pair_count_matrices",
    "pairwise_matrices",
    "per_class",
    "predicted_classes",
    "prediction_difference",
    "rank_in_old",
    "schurn",
    "softmax",
    "update_cost",
    "wilson_interval",
]
