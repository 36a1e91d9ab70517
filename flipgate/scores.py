"""Every model's scores as float32 log-space logits (N, C), whatever the model outputs.

Logits pass through. Probabilities p become log(max(p, PROBABILITY_FLOOR)): a softmax of
them gives the model's own probabilities back (so ECE, the confidence gap and SChurn are
the model's), and displacement reads log-probabilities. A single score column, (N, 1) or
(N,), is class 1 of a binary classifier: a probability p becomes [log(1 - p), log p] and a
logit z becomes [0, z]. Exact 0s and 1s (a forest's votes, a saturated sigmoid) are floored,
so they never turn into NaN or infinities.

A multi-label model's scores (N, L) are one score per label instead (docs/metrics.md
§Multi-label pair metrics): `label_probabilities` makes them the probability that each
sample has each label, σ(z) of a logit z, probabilities as they are; `label_logits` turns
such probabilities back into each label's logit log p − log(1 − p).
"""

import numpy as np

from flipgate.errors import InputError

LOGITS = "logits"
PROBABILITIES = "probabilities"
SCORE_KINDS = (LOGITS, PROBABILITIES)
PROBABILITY_FLOOR = 1e-30  # log(1e-30) = -69.08: an exact 0 becomes this log-probability
PROBABILITY_SLACK = 1e-3  # rounding a model's probabilities may carry outside [0, 1]


def check_score_kind(kind: str) -> str:
    """`kind` if it names a kind of scores, else an InputError."""
    if kind not in SCORE_KINDS:
        raise InputError("invalid_scores", f"scores must be one of {SCORE_KINDS}, "
                           f"not {kind!r}")
    return kind


def to_logits(scores: np.ndarray, kind: str, *, source: str = "scores") -> np.ndarray:
    """Scores of shape (N, C), (N, 1) or (N,) that are `kind` ("logits" or "probabilities")
    as float32 logits (N, C), C >= 2; scores must be finite, probabilities within [0, 1]."""
    check_score_kind(kind)
    scores = np.asarray(scores)
    if scores.ndim == 1:
        scores = scores[:, None]
    if scores.ndim != 2 or not np.issubdtype(scores.dtype, np.floating):
        raise InputError("scores_shape", f"{source}: scores must be floats of shape (N, C), "
                           f"(N, 1) or (N,), got {scores.dtype} {scores.shape}")
    if not np.isfinite(scores).all():
        raise InputError("model_output_not_finite", f"{source}: NaN or infinite {kind}")
    if kind == LOGITS:
        return _binary_logits(scores) if scores.shape[1] == 1 else scores.astype(np.float32)
    return _log_probabilities(scores, source)


def _binary_logits(logit: np.ndarray) -> np.ndarray:
    """[0, z] for the logit z of class 1: a softmax of it is [1 - sigmoid(z), sigmoid(z)]."""
    return np.concatenate([np.zeros_like(logit), logit], axis=1).astype(np.float32)


def _check_probabilities(p: np.ndarray, source: str) -> None:
    if p.min() < -PROBABILITY_SLACK or p.max() > 1 + PROBABILITY_SLACK:
        raise InputError("scores_not_probabilities", f"{source}: probabilities must lie in "
                           f"[0, 1], these reach [{p.min():.4g}, {p.max():.4g}]; if they are "
                           "logits, say so (scores=logits)")


def _log_probabilities(p: np.ndarray, source: str) -> np.ndarray:
    _check_probabilities(p, source)
    p = np.clip(p.astype(np.float64), 0.0, 1.0)
    if p.shape[1] == 1:
        p = np.concatenate([1.0 - p, p], axis=1)
    return np.log(np.maximum(p, PROBABILITY_FLOOR)).astype(np.float32)


def label_probabilities(scores: np.ndarray, kind: str, *, source: str = "scores") -> np.ndarray:
    """Multi-label scores (N, L) that are `kind` as float64 probabilities (N, L): a logit z
    becomes σ(z) = 1 / (1 + e^-z); scores must be finite, probabilities within [0, 1]."""
    check_score_kind(kind)
    scores = np.asarray(scores)
    if scores.ndim != 2 or not np.issubdtype(scores.dtype, np.floating):
        raise InputError("scores_shape", f"{source}: multi-label scores must be floats of "
                           f"shape (N, L), got {scores.dtype} {scores.shape}")
    if not np.isfinite(scores).all():
        raise InputError("model_output_not_finite", f"{source}: NaN or infinite {kind}")
    scores = scores.astype(np.float64)
    if kind == LOGITS:
        with np.errstate(over="ignore"):  # e^-z = inf for z < -709: σ(z) = 0, as it should
            return 1.0 / (1.0 + np.exp(-scores))
    _check_probabilities(scores, source)
    return np.clip(scores, 0.0, 1.0)


def label_logits(p: np.ndarray) -> np.ndarray:
    """Each label's logit log p − log(1 − p) of multi-label probabilities p (N, L), as
    float32; exact 0s and 1s are floored (a saturated sigmoid stays finite)."""
    return (np.log(np.maximum(p, PROBABILITY_FLOOR))
            - np.log(np.maximum(1 - p, PROBABILITY_FLOOR))).astype(np.float32)
