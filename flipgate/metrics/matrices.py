"""NFR, PFR and churn for every ordered pair of V versions, from compact predicted classes.

A version is one 1-D array of predicted classes in the smallest unsigned dtype that holds the
classes (`predicted_classes` makes it from logits, chunk by chunk). The counts are taken over
blocks of samples that stay in cache, for the upper triangle of pairs only: the samples both
versions get right are popcounts of the AND of their packed correctness bits, and the samples
they predict alike are counted by comparing each version with the later ones. Every rate is an
exact integer count over N, so the matrices equal those of a plain loop over pairs bit for bit;
`pair_count_matrices` gives those counts themselves (the server stores them per pair).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flipgate.metrics.chunks import chunk_rows, release, sample_ranges

CHUNK_SAMPLES = 1 << 15  # samples per block: V versions × 32768 uint16 stay in L2


def class_dtype(num_classes: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds the classes 0..num_classes-1."""
    return np.min_scalar_type(max(num_classes - 1, 0))


def predicted_classes(logits: np.ndarray, chunk_size: int | None = None) -> np.ndarray:
    """argmax of (N, C) logits (an array or a memory-mapped .npy) in `class_dtype(C)`,
    reading `chunk_size` samples at a time (by default about 2 MB of logits)."""
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must be an (N, C) array, got shape {logits.shape}")
    predictions = np.empty(logits.shape[0], dtype=class_dtype(logits.shape[1]))
    for start, stop in sample_ranges(logits.shape[0], chunk_rows(logits.shape[1], chunk_size)):
        predictions[start:stop] = logits[start:stop].argmax(axis=1)
        release(logits, start, stop)
    return predictions


@dataclass(frozen=True, eq=False)
class PairCountMatrices:
    """Exact V×V int64 counts over n samples: only_right[i][j] is the samples version i gets
    right and version j wrong (NFR of i → j times n; PFR of i → j is only_right[j][i]), and
    differ[i][j] the samples they predict differently (symmetric; churn times n)."""

    n: int
    only_right: np.ndarray
    differ: np.ndarray


def pair_count_matrices(
    predictions: Sequence[np.ndarray], labels: np.ndarray
) -> PairCountMatrices:
    """The integer counts behind the matrices of V 1-D predicted-class arrays."""
    predictions, labels = _validated(predictions, labels)
    both_right, same = _pair_counts(predictions, labels)
    return PairCountMatrices(labels.size, np.diag(both_right)[:, None] - both_right,
                             labels.size - same)


def label_pair_count_matrices(decisions: Sequence[np.ndarray],
                              labels: np.ndarray) -> PairCountMatrices:
    """The counts behind the per-sample matrices of V multi-label versions (docs/metrics.md
    §Multi-label pair metrics): `decisions` their 0/1 (N, L) arrays, `labels` y (N, L);
    only_right[i][j] is the samples with at least one label that i gets right and j wrong
    (NFR_sample of i → j times n; PFR_sample is only_right[j][i]), differ[i][j] the samples
    they decide differently on at least one label (churn_sample times n)."""
    labels = np.asarray(labels, dtype=bool)
    if labels.ndim != 2 or any(np.shape(side) != labels.shape for side in decisions):
        raise ValueError(f"decisions and labels must share one (N, L) shape, got "
                         f"{[np.shape(side) for side in decisions]} and {labels.shape}")
    versions = len(decisions)
    only_right = np.zeros((versions, versions), dtype=np.int64)
    differ = np.zeros((versions, versions), dtype=np.int64)
    for start, stop in sample_ranges(labels.shape[0], chunk_rows(labels.shape[1])):
        chunk = [np.asarray(side[start:stop]) != 0 for side in decisions]
        right = [side == labels[start:stop] for side in chunk]
        for i in range(versions):
            for j in range(versions):
                only_right[i, j] += int((right[i] & ~right[j]).any(axis=1).sum())
                differ[i, j] += int((chunk[i] != chunk[j]).any(axis=1).sum())
    return PairCountMatrices(labels.shape[0], only_right, differ)


def matrices_from_predictions(
    predictions: Sequence[np.ndarray], labels: np.ndarray
) -> dict[str, np.ndarray]:
    """V×V float arrays "nfr", "pfr" and "churn" of V 1-D predicted-class arrays;
    entry [i][j] has version i old and j new."""
    counts = pair_count_matrices(predictions, labels)
    nfr = counts.only_right / counts.n
    return {"nfr": nfr, "pfr": nfr.T.copy(), "churn": counts.differ / counts.n}


def pairwise_matrices(predictions: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """`matrices_from_predictions` of a (V, N) integer array, one row per version."""
    predictions = np.asarray(predictions)
    if predictions.ndim != 2 or not np.issubdtype(predictions.dtype, np.integer):
        raise ValueError(f"predictions must be a (V, N) integer array, got {predictions.shape} "
                         f"{predictions.dtype}")
    return matrices_from_predictions(list(predictions), labels)


def _validated(
    predictions: Sequence[np.ndarray], labels: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.shape} {labels.dtype}")
    predictions = [np.asarray(version) for version in predictions]
    if not predictions or any(version.shape != labels.shape
                              or not np.issubdtype(version.dtype, np.integer)
                              for version in predictions):
        raise ValueError(f"predictions must be one integer array of shape {labels.shape} per "
                         "version (labels must be an integer array of shape (N,), one label "
                         "per sample)")
    if labels.size == 0:
        raise ValueError("pairwise matrices need at least one sample")
    return predictions, labels


def _pair_counts(
    predictions: list[np.ndarray], labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric V×V int64 counts: samples both versions get right, samples they predict alike."""
    versions = len(predictions)
    dtype = _common_dtype(predictions, labels)
    both_right = np.zeros((versions, versions), dtype=np.int64)
    same = np.zeros((versions, versions), dtype=np.int64)
    for start in range(0, labels.size, CHUNK_SAMPLES):
        block = np.stack([version[start : start + CHUNK_SAMPLES] for version in predictions])
        block = block.astype(dtype, copy=False)
        bits = np.packbits(block == labels[start : start + CHUNK_SAMPLES].astype(dtype), axis=1)
        for i in range(versions):  # row i of the upper triangle, diagonal included
            both_right[i, i:] += np.bitwise_count(bits[i:] & bits[i]).sum(axis=1, dtype=np.int64)
            same[i, i + 1 :] += _row_sums(block[i + 1 :] == block[i])
    upper = np.triu_indices(versions, k=1)
    for counts in (both_right, same):
        counts[upper[::-1]] = counts[upper]
    np.fill_diagonal(same, labels.size)
    return both_right, same


def _row_sums(flags: np.ndarray) -> np.ndarray:
    """True values per row of a 2-D bool array, summed as bytes in the narrowest exact dtype."""
    return np.add.reduce(flags.view(np.uint8), axis=1, dtype=np.min_scalar_type(flags.shape[1]))


def _common_dtype(predictions: list[np.ndarray], labels: np.ndarray) -> np.dtype:
    """The smallest dtype holding every class; negative classes are refused."""
    low = min(int(labels.min()), *(int(version.min()) for version in predictions))
    high = max(int(labels.max()), *(int(version.max()) for version in predictions))
    if low < 0:
        raise ValueError(f"classes must be non-negative, got {low}")
    return class_dtype(high + 1)
