"""Every compatibility number for one (old, new, eval set) triple, ready for JSON."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from flipgate.metrics.calibration import confidence_gap, expected_calibration_error
from flipgate.metrics.displacement import describe, logit_displacement, rank_in_old
from flipgate.metrics.diversity import prediction_difference
from flipgate.metrics.flips import FlipCounts, count_flips, flipped_indices, per_class
from flipgate.metrics.probs import softmax
from flipgate.metrics.schurn import schurn
from flipgate.metrics.stats import mcnemar_one_sided_p, wilson_interval


@dataclass(frozen=True, eq=False)
class PairAnalysis:
    """Per-sample arrays of an old/new comparison; `to_dict` summarises them.

    "kept" samples are those whose predicted label did not change.
    """

    old_logits: np.ndarray
    new_logits: np.ndarray
    labels: np.ndarray
    schurn_alpha: float = 1.0

    def __post_init__(self) -> None:
        shape = self.old_logits.shape
        if self.new_logits.shape != shape or len(shape) != 2 or shape[0] < 1 or shape[1] < 2:
            raise ValueError(f"old and new logits must share one (N, C) shape with N >= 1 and "
                             f"C >= 2, got {shape} and {self.new_logits.shape}")
        if self.labels.shape != shape[:1]:
            raise ValueError(f"{self.labels.size} labels for {shape[0]} samples")
        if self.labels.min() < 0 or self.labels.max() >= shape[1]:
            raise ValueError(f"labels must lie in [0, {shape[1]})")

    @property
    def num_classes(self) -> int:
        return self.old_logits.shape[1]

    @cached_property
    def old_probs(self) -> np.ndarray:
        return softmax(self.old_logits)

    @cached_property
    def new_probs(self) -> np.ndarray:
        return softmax(self.new_logits)

    @cached_property
    def old_pred(self) -> np.ndarray:
        return self.old_logits.argmax(axis=1)

    @cached_property
    def new_pred(self) -> np.ndarray:
        return self.new_logits.argmax(axis=1)

    @cached_property
    def counts(self) -> FlipCounts:
        return count_flips(self.old_pred, self.new_pred, self.labels)

    @cached_property
    def flipped(self) -> dict[str, np.ndarray]:
        return flipped_indices(self.old_pred, self.new_pred, self.labels)

    @cached_property
    def displacement(self) -> np.ndarray:
        return logit_displacement(self.old_logits, self.new_logits)

    @cached_property
    def old_gap(self) -> np.ndarray:
        return confidence_gap(self.old_probs)

    @cached_property
    def new_gap(self) -> np.ndarray:
        return confidence_gap(self.new_probs)

    @cached_property
    def negative_flip_ranks(self) -> np.ndarray:
        """Rank of each negative flip's new (wrong) class among the old model's logits."""
        indices = self.flipped["negative"]
        return rank_in_old(self.old_logits, self.new_pred[indices], indices)

    def to_dict(self) -> dict:
        """All numbers of `flipgate compare --json`."""
        counts = self.counts
        n = counts.n
        return {
            "n": n,
            "num_classes": self.num_classes,
            **counts.rates(),
            "schurn": schurn(self.old_logits, self.new_logits, self.schurn_alpha),
            "schurn_alpha": self.schurn_alpha,
            "negative_flips": counts.negative_flips,
            "positive_flips": counts.positive_flips,
            "both_wrong": counts.both_wrong,
            "nfr_ci": list(wilson_interval(counts.negative_flips, n)),
            "pfr_ci": list(wilson_interval(counts.positive_flips, n)),
            "churn_ci": list(wilson_interval(counts.changed, n)),
            "mcnemar_p": mcnemar_one_sided_p(counts.negative_flips, counts.positive_flips),
            "confidence": self._confidence(),
            "displacement": self._displacement(),
            "flip_rank": self._flip_rank(),
            "prediction_difference": prediction_difference(
                np.stack([self.old_probs, self.new_probs]), self.labels
            ),
            "per_class": per_class(self.old_pred, self.new_pred, self.labels, self.num_classes),
            "flipped_indices": {kind: idx.tolist() for kind, idx in self.flipped.items()},
        }

    def _confidence(self) -> dict:
        negative = self.flipped["negative"]
        return {
            "old_mean_gap": float(self.old_gap.mean()),
            "new_mean_gap": float(self.new_gap.mean()),
            "old_ece": expected_calibration_error(self.old_probs, self.labels),
            "new_ece": expected_calibration_error(self.new_probs, self.labels),
            "negative_flips_old_gap": describe(self.old_gap[negative]),
            "negative_flips_new_gap": describe(self.new_gap[negative]),
        }

    def _displacement(self) -> dict:
        changed = self.old_pred != self.new_pred
        return {
            "all": describe(self.displacement),
            "negative_flips": describe(self.displacement[self.flipped["negative"]]),
            "kept": describe(self.displacement[~changed]),
        }

    def _flip_rank(self) -> dict:
        ranks = self.negative_flip_ranks
        histogram = np.bincount(ranks, minlength=2)[1:] if ranks.size else np.zeros(0, int)
        return {
            "summary": describe(ranks.astype(np.float64)),
            "counts": {str(rank): int(c) for rank, c in enumerate(histogram, start=1) if c},
        }


def compare_logits(
    old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray, schurn_alpha: float = 1.0
) -> dict:
    """Every compatibility metric of DESIGN §4 for one pair, as a JSON-ready dict."""
    return PairAnalysis(old_logits, new_logits, labels, schurn_alpha).to_dict()
