"""Negative/positive flips, error rates and churn between two models (docs/metrics.md)."""

from dataclasses import dataclass, fields

import numpy as np


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when the denominator is zero."""
    return numerator / denominator if denominator else None


@dataclass(frozen=True)
class FlipCounts:
    """Integer counts of how predictions moved between two models on one labeled set.

    Every rate is derived from these counts, so the identities of docs/metrics.md hold exactly
    on the counts (for example new_wrong - old_wrong == negative_flips - positive_flips).
    """

    n: int
    old_wrong: int
    new_wrong: int
    negative_flips: int
    positive_flips: int
    both_wrong: int
    both_wrong_changed: int

    def __add__(self, other: "FlipCounts") -> "FlipCounts":
        """The counts of two disjoint sets of samples together (chunks of one eval set)."""
        return FlipCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def old_right(self) -> int:
        return self.n - self.old_wrong

    @property
    def both_right(self) -> int:
        return self.old_right - self.negative_flips

    @property
    def changed(self) -> int:
        """Samples whose predicted label differs between the models."""
        return self.negative_flips + self.positive_flips + self.both_wrong_changed

    @property
    def nfr_mc(self) -> float:
        """MUSCLE's NFR_mc: new wrong and different from the old prediction, per sample."""
        return (self.negative_flips + self.both_wrong_changed) / self.n

    def rates(self) -> dict[str, float | None]:
        """ER, NFR, PFR, Rel-NFR, NFI, BTC, BEC and the three churn rates."""
        n = self.n
        er_old, er_new, nfr = self.old_wrong / n, self.new_wrong / n, self.negative_flips / n
        return {
            "er_old": er_old,
            "er_new": er_new,
            "nfr": nfr,
            "pfr": self.positive_flips / n,
            "rel_nfr": ratio(nfr, (1 - er_old) * er_new),
            "nfi": ratio(self.negative_flips, self.new_wrong),
            "btc": ratio(self.both_right, self.old_right),
            "bec": ratio(self.both_wrong, self.new_wrong),
            "churn": self.changed / n,
            "churn_old_correct": ratio(self.negative_flips, self.old_right),
            "churn_old_incorrect": ratio(
                self.positive_flips + self.both_wrong_changed, self.old_wrong
            ),
        }


def count_flips(old_pred: np.ndarray, new_pred: np.ndarray, labels: np.ndarray) -> FlipCounts:
    """Count flips between two (N,) arrays of predicted labels against (N,) true labels."""
    old_right, new_right = old_pred == labels, new_pred == labels
    both_wrong = ~old_right & ~new_right
    return FlipCounts(
        n=int(labels.size),
        old_wrong=int(np.count_nonzero(~old_right)),
        new_wrong=int(np.count_nonzero(~new_right)),
        negative_flips=int(np.count_nonzero(old_right & ~new_right)),
        positive_flips=int(np.count_nonzero(~old_right & new_right)),
        both_wrong=int(np.count_nonzero(both_wrong)),
        both_wrong_changed=int(np.count_nonzero(both_wrong & (old_pred != new_pred))),
    )


def flipped_indices(
    old_pred: np.ndarray, new_pred: np.ndarray, labels: np.ndarray
) -> dict[str, np.ndarray]:
    """Sample indices of negative flips (old right, new wrong) and positive flips."""
    old_right, new_right = old_pred == labels, new_pred == labels
    return {
        "negative": np.flatnonzero(old_right & ~new_right),
        "positive": np.flatnonzero(~old_right & new_right),
    }


@dataclass(frozen=True)
class SliceCounts:
    """Samples, errors and flips per slice (a true class or a group), slices numbered 0..k-1."""

    n: np.ndarray
    old_wrong: np.ndarray
    new_wrong: np.ndarray
    negative_flips: np.ndarray
    positive_flips: np.ndarray

    @classmethod
    def count(
        cls, slices: np.ndarray, old_right: np.ndarray, new_right: np.ndarray, size: int
    ) -> "SliceCounts":
        """Tally each sample into its slice; `old_right`/`new_right` are per-sample booleans."""

        def tally(mask: np.ndarray) -> np.ndarray:
            return np.bincount(slices[mask], minlength=size)

        return cls(np.bincount(slices, minlength=size), tally(~old_right), tally(~new_right),
                   tally(old_right & ~new_right), tally(~old_right & new_right))

    @classmethod
    def zeros(cls, size: int) -> "SliceCounts":
        return cls(*[np.zeros(size, dtype=np.int64)] * len(fields(cls)))

    def __add__(self, other: "SliceCounts") -> "SliceCounts":
        return SliceCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def row(self, index: int) -> dict[str, float | int | None]:
        """n, ER of both models, NFR, PFR and the flip counts of one slice."""
        n, negative, positive = (int(self.n[index]), int(self.negative_flips[index]),
                                 int(self.positive_flips[index]))
        return {
            "n": n,
            "er_old": ratio(int(self.old_wrong[index]), n),
            "er_new": ratio(int(self.new_wrong[index]), n),
            "nfr": ratio(negative, n),
            "pfr": ratio(positive, n),
            "negative_flips": negative,
            "positive_flips": positive,
        }


def per_class(
    old_pred: np.ndarray, new_pred: np.ndarray, labels: np.ndarray, num_classes: int
) -> list[dict[str, float | int | None]]:
    """NFR, PFR and ER of both models among the samples of each true class."""
    counts = SliceCounts.count(labels, old_pred == labels, new_pred == labels, num_classes)
    return [{"class": c, **counts.row(c)} for c in range(num_classes)]
