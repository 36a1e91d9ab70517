"""Prediction confidence γ and expected calibration error (DESIGN §4)."""

import numpy as np


def confidence_gap(probs: np.ndarray) -> np.ndarray:
    """γ = p_top1 − p_top2 per sample, from (N, C) probabilities with C >= 2."""
    top2 = np.partition(probs, -2, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> float:
    """ECE over `bins` equal-width confidence bins (0, 1/bins], …; confidence = max probability."""
    confidence = probs.max(axis=-1)
    correct = probs.argmax(axis=-1) == labels
    bin_of = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    gap = np.bincount(bin_of, weights=correct - confidence, minlength=bins)
    return float(np.abs(gap).sum() / labels.size)
