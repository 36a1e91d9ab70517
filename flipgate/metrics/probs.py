"""Turning logits into class probabilities."""

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (N, C) logits, computed stably in the logits' float precision."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)

