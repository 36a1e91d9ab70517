"""How far logits move between models, and where a flipped sample's new class stood before."""

import numpy as np


def logit_displacement(old_logits: np.ndarray, new_logits: np.ndarray) -> np.ndarray:
    """‖z_new − z_old‖₂ per sample."""
    return np.linalg.norm(new_logits - old_logits, axis=-1)


def rank_in_old(old_logits: np.ndarray, classes: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """1-based rank of classes[i] among the old logits of sample indices[i]; ties rank higher."""
    rows = old_logits[indices]
    chosen = rows[np.arange(indices.size), classes]
    return 1 + np.count_nonzero(rows > chosen[:, None], axis=-1)


def describe(values: np.ndarray) -> dict[str, float | int | None]:
    """Count, mean, median, 90th percentile and max of a sample (None for an empty one)."""
    if values.size == 0:
        return {"count": 0, "mean": None, "median": None, "p90": None, "max": None}
    return {
        "count": int(values.size),
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "p90": float(np.percentile(values, 90)),
        "max": float(values.max()),
    }
