"""NFR, PFR and churn for every ordered pair of V versions, as linear algebra (DESIGN §4).

With C the (V, N) 0/1 matrix of correct predictions, G = C·Cᵀ counts the samples both
versions of a pair get right, so NFR[i][j] = (G[i][i] − G[i][j]) / N. Two versions agree
on a sample when both are right or both are wrong with the same label, so
churn[i][j] = 1 − (G[i][j] + A[i][j]) / N, where A counts the wrong-and-equal samples; A
is only computed over samples at least two versions get wrong, usually a small fraction.
"""

import numpy as np

CHUNK_SAMPLES = 1 << 18  # float32 sums of 0/1 over a chunk stay exact (< 2**24)


def pairwise_matrices(predictions: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """V×V float arrays "nfr", "pfr" and "churn"; entry [i][j] has version i old, j new."""
    predictions, labels = _validated(predictions, labels)
    n = labels.size
    correct = predictions == labels
    both_right = _both_right_counts(correct)
    right = np.diag(both_right)
    nfr = (right[:, None] - both_right) / n
    agree = both_right + _wrong_agreement_counts(predictions, correct)
    np.fill_diagonal(agree, n)
    return {"nfr": nfr, "pfr": nfr.T.copy(), "churn": 1.0 - agree / n}


def _validated(predictions: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim != 2 or not np.issubdtype(predictions.dtype, np.integer):
        raise ValueError(f"predictions must be a (V, N) integer array, got {predictions.shape} "
                         f"{predictions.dtype}")
    if labels.shape != predictions.shape[1:] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be an integer array of shape ({predictions.shape[1]},), "
                         f"got {labels.shape} {labels.dtype}")
    if labels.size == 0:
        raise ValueError("pairwise matrices need at least one sample")
    return predictions, labels


def _both_right_counts(correct: np.ndarray) -> np.ndarray:
    """G = C·Cᵀ accumulated chunk by chunk: exact counts with bounded memory."""
    versions = correct.shape[0]
    counts = np.zeros((versions, versions), dtype=np.float64)
    for start in range(0, correct.shape[1], CHUNK_SAMPLES):
        block = correct[:, start : start + CHUNK_SAMPLES].astype(np.float32)
        counts += block @ block.T
    return counts


def _wrong_agreement_counts(predictions: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """A[i][j] = #samples that versions i and j both get wrong with the same label (i ≠ j)."""
    versions = predictions.shape[0]
    shared_errors = np.count_nonzero(~correct, axis=0) >= 2
    # A right answer never matches another version: replace it by a code unique to the version.
    codes = np.where(
        correct[:, shared_errors],
        np.arange(-1, -versions - 1, -1, dtype=np.int32)[:, None],
        predictions[:, shared_errors].astype(np.int32),
    )
    upper = np.zeros((versions, versions), dtype=np.float64)
    for start in range(0, codes.shape[1], CHUNK_SAMPLES):
        block = codes[:, start : start + CHUNK_SAMPLES]
        for i in range(versions - 1):  # one vectorised row of the upper triangle at a time
            upper[i, i + 1 :] += np.count_nonzero(block[i + 1 :] == block[i], axis=1)
    return upper + upper.T
