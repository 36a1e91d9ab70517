"""Prediction difference among M models trained alike (Anti-Distillation paper; docs/metrics.md)."""

import numpy as np

from flipgate.metrics.matrices import pairwise_matrices


def prediction_difference(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Δ1, Δ2, Δ^L_1 and Δ_H of (M, N, C) probabilities from M >= 2 models."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3 or probs.shape[0] < 2:
        raise ValueError(f"need (M, N, C) probabilities with M >= 2, got shape {probs.shape}")
    mean = probs.mean(axis=0)
    deviation = probs - mean
    samples = np.arange(labels.size)
    label_mean = mean[samples, labels]
    label_deviation = np.divide(
        np.abs(deviation[:, samples, labels]), label_mean,
        out=np.zeros((probs.shape[0], labels.size)), where=label_mean > 0,
    )
    churn = pairwise_matrices(probs.argmax(axis=-1), labels)["churn"]
    models = probs.shape[0]
    return {
        "delta_1": float(np.abs(deviation).sum(-1).mean()),
        "delta_2": float(np.sqrt((deviation**2).sum(-1)).mean()),
        "delta_l1": float(label_deviation.mean()),
        "delta_h": float(churn[np.triu_indices(models, k=1)].mean()),
    }
