"""Prediction confidence γ and expected calibration error (docs/metrics.md)."""

import numpy as np

ECE_BINS = 15


def confidence_gap(probs: np.ndarray) -> np.ndarray:
    """γ = p_top1 − p_top2 per sample, from (N, C) probabilities with C >= 2."""
    top2 = np.partition(probs, -2, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def expected_calibration_error(
    probs: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS
) -> float:
    """ECE over `bins` equal-width confidence bins (0, 1/bins], …; confidence = max probability."""
    gaps = calibration_gaps(probs.max(axis=-1), probs.argmax(axis=-1) == labels, bins)
    return float(np.abs(gaps).sum() / labels.size)


def calibration_gaps(
    confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS
) -> np.ndarray:
    """Σ (correct − confidence) per confidence bin: ECE = Σ|gaps| / N, summable over chunks."""
    bin_of = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    return np.bincount(bin_of, weights=correct - confidence, minlength=bins)
