"""The smooth surrogate churn SChurn of Bhojanapalli et al. (docs/metrics.md)."""

import numpy as np

from flipgate.metrics.probs import softmax


def schurn(logits_a: np.ndarray, logits_b: np.ndarray, alpha: float = 1.0) -> float:
    """SChurn_α = ½ · mean ‖(p_a / max p_a)^α − (p_b / max p_b)^α‖₁ with p = softmax."""
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    return 0.5 * float(np.mean(np.abs(_scaled(logits_a, alpha) - _scaled(logits_b, alpha)).sum(-1)))


def _scaled(logits: np.ndarray, alpha: float) -> np.ndarray:
    probs = softmax(logits)
    return (probs / probs.max(axis=-1, keepdims=True)) ** alpha
