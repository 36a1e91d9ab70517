"""Negative/positive flips, error rates and churn between an old and a new model (DESIGN §4)."""

from dataclasses import dataclass

import numpy as np


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when the denominator is zero."""
    return numerator / denominator if denominator else None


@dataclass(frozen=True)
class FlipCounts:
    """Integer counts of how predictions moved between two models on one labeled set.

    Every rate is derived from these counts, so the identities of DESIGN §4 hold exactly
    on the counts (for example new_wrong - old_wrong == negative_flips - positive_flips).
    """

    n: int
    old_wrong: int
    new_wrong: int
    negative_flips: int
    positive_flips: int
    both_wrong: int
    both_wrong_changed: int

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


def per_class(
    old_pred: np.ndarray, new_pred: np.ndarray, labels: np.ndarray, num_classes: int
) -> list[dict[str, float | int | None]]:
    """NFR, PFR and ER of both models among the samples of each true class."""
    old_right, new_right = old_pred == labels, new_pred == labels

    def per_label(mask: np.ndarray) -> np.ndarray:
        return np.bincount(labels[mask], minlength=num_classes)

    support = np.bincount(labels, minlength=num_classes)
    old_wrong, new_wrong = per_label(~old_right), per_label(~new_right)
    negative, positive = per_label(old_right & ~new_right), per_label(~old_right & new_right)
    return [
        {
            "class": c,
            "n": int(support[c]),
            "er_old": ratio(int(old_wrong[c]), int(support[c])),
            "er_new": ratio(int(new_wrong[c]), int(support[c])),
            "nfr": ratio(int(negative[c]), int(support[c])),
            "pfr": ratio(int(positive[c]), int(support[c])),
            "negative_flips": int(negative[c]),
            "positive_flips": int(positive[c]),
        }
        for c in range(num_classes)
    ]
