"""Every compatibility number for one (old, new, eval set) triple, ready for JSON.

`compare_logits` streams over the samples: it reads `chunk_size` rows of both logits at a
time (arrays or memory-mapped `.npy` files), so its memory is a few chunks plus a few bytes
per sample, never the logits. Counts, flips, per-class and per-group tables are exact
integer tallies; means, SChurn, ECE bins and the prediction difference are sums over the
chunks. The quantiles (median, p90) are exact: the per-sample logit displacement and both
confidence gaps (12 bytes a sample for float32 logits, also what the HTML page plots) and the
ranks of the negative flips are kept, and `np.median` / `np.percentile` (linear
interpolation) run on them at the end.
"""

from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from flipgate.metrics.calibration import ECE_BINS, calibration_gaps
from flipgate.metrics.chunks import chunk_rows
from flipgate.metrics.displacement import describe, rank_in_old
from flipgate.metrics.flips import FlipCounts, SliceCounts, count_flips, flipped_indices
from flipgate.metrics.kernel import PairChunk, pair_chunks
from flipgate.metrics.stats import mcnemar_one_sided_p, wilson_interval
from flipgate.progress import Progress

REPORT_CHUNK_ELEMENTS = 1 << 22  # values per logits array and chunk by default: 16 MB of float32


def check_pair(old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray) -> None:
    """Both logits (N, C) with N >= 1 and C >= 2, and N labels in [0, C)."""
    shape = old_logits.shape
    if new_logits.shape != shape or len(shape) != 2 or shape[0] < 1 or shape[1] < 2:
        raise ValueError(f"old and new logits must share one (N, C) shape with N >= 1 and "
                         f"C >= 2, got {shape} and {new_logits.shape}")
    if labels.shape != shape[:1]:
        raise ValueError(f"{labels.size} labels for {shape[0]} samples")
    if labels.min() < 0 or labels.max() >= shape[1]:
        raise ValueError(f"labels must lie in [0, {shape[1]})")


def compare_logits(
    old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray, schurn_alpha: float = 1.0,
    *, groups: np.ndarray | None = None, chunk_size: int | None = None,
    progress: Progress | None = None,
) -> dict:
    """Every compatibility metric of docs/metrics.md for one pair, as a JSON-ready dict.

    `groups` (one string or integer per sample) adds the `per_group` table; `chunk_size`
    is the number of samples read at a time; `progress(done, total)` follows the chunks.
    """
    return measure_pair(old_logits, new_logits, labels, schurn_alpha, groups=groups,
                        chunk_size=chunk_size, progress=progress)[0]


@dataclass(frozen=True, eq=False)
class PlotValues:
    """The per-sample values that the HTML report plots (a few bytes a sample)."""

    counts: FlipCounts
    flipped: dict[str, np.ndarray]  # the "negative" and "positive" flips' indices
    kept: np.ndarray  # whether the predicted class stayed the same
    displacement: np.ndarray
    old_gap: np.ndarray
    new_gap: np.ndarray


def measure_pair(
    old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray, schurn_alpha: float = 1.0,
    *, groups: np.ndarray | None = None, chunk_size: int | None = None,
    progress: Progress | None = None,
) -> tuple[dict, PlotValues]:
    """`compare_logits`'s report and the values its plots draw, in one streamed pass."""
    labels = np.asarray(labels)
    check_pair(old_logits, new_logits, labels)
    if schurn_alpha <= 0:
        raise ValueError(f"alpha must be positive, got {schurn_alpha}")
    n, num_classes = old_logits.shape
    tally = PairTally(n, num_classes, schurn_alpha, Slices.of(groups, n))
    rows = chunk_rows(num_classes, chunk_size, REPORT_CHUNK_ELEMENTS)
    for start, stop, chunk in pair_chunks(old_logits, new_logits, labels, schurn_alpha, rows):
        tally.add(start, chunk, old_logits[start:stop], labels[start:stop])
        if progress:
            progress(stop, n)
    return tally.report(), tally.plot_values()


@dataclass(frozen=True)
class Slices:
    """Per-sample group codes 0..k-1 and the group each code stands for."""

    codes: np.ndarray
    names: list

    @classmethod
    def of(cls, groups: np.ndarray | None, n: int) -> "Slices | None":
        """The slices of a `groups` array (None without one), validated."""
        if groups is None:
            return None
        groups = np.asarray(groups)
        if groups.shape != (n,) or groups.dtype.kind not in "iuUSO":
            raise ValueError(f"groups must hold one string or integer per sample ({n}), got "
                             f"shape {groups.shape} and dtype {groups.dtype}")
        names, codes = np.unique(groups, return_inverse=True)
        return cls(codes.reshape(-1), [name.item() if hasattr(name, "item") else name
                                       for name in names])


class PairTally:
    """Sums, counts and kept per-sample values of an old/new comparison, chunk by chunk."""

    def __init__(self, n: int, num_classes: int, alpha: float, groups: "Slices | None") -> None:
        self.n, self.num_classes, self.alpha, self.groups = n, num_classes, alpha, groups
        self.counts = FlipCounts(*[0] * len(fields(FlipCounts)))
        self.classes = SliceCounts.zeros(num_classes)
        self.by_group = SliceCounts.zeros(len(groups.names) if groups else 0)
        self.sums = dict.fromkeys(("schurn", "old_gap", "new_gap", "delta_1", "delta_2",
                                   "delta_l1"), 0.0)
        self.ece = {"old": np.zeros(ECE_BINS), "new": np.zeros(ECE_BINS)}
        self.per_sample: dict[str, np.ndarray] = {}  # displacement, old_gap, new_gap
        self.kept = np.zeros(n, dtype=bool)
        self.flips: dict[str, list[np.ndarray]] = {
            key: [] for key in ("negative", "positive", "rank")}

    def add(self, start: int, chunk: PairChunk, old_logits: np.ndarray,
            labels: np.ndarray) -> None:
        """Fold the chunk of samples [start, start + len(labels)) into the tally."""
        old_pred, new_pred = chunk.predictions("old"), chunk.predictions("new")
        self._keep(start, "displacement", chunk.displacement)
        self.kept[start : start + labels.size] = old_pred == new_pred
        self._count(start, old_pred, new_pred, labels)
        negative = np.flatnonzero((old_pred == labels) & (new_pred != labels))
        self.flips["rank"].append(rank_in_old(old_logits, new_pred[negative], negative))
        for model, pred in (("old", old_pred), ("new", new_pred)):
            gap = chunk.gap(model)
            self.sums[f"{model}_gap"] += float(gap.sum(dtype=np.float64))
            self._keep(start, f"{model}_gap", gap)
            self.ece[model] += calibration_gaps(chunk.confidence(model), pred == labels)
        self._sum_distances(chunk)

    def _keep(self, start: int, name: str, values: np.ndarray) -> None:
        """Store a chunk's values of a per-sample array (of the chunk's dtype)."""
        if name not in self.per_sample:
            self.per_sample[name] = np.empty(self.n, dtype=values.dtype)
        self.per_sample[name][start : start + values.size] = values

    def _count(self, start: int, old_pred: np.ndarray, new_pred: np.ndarray,
               labels: np.ndarray) -> None:
        old_right, new_right = old_pred == labels, new_pred == labels
        self.counts += count_flips(old_pred, new_pred, labels)
        self.classes += SliceCounts.count(labels, old_right, new_right, self.num_classes)
        if self.groups:
            codes = self.groups.codes[start : start + labels.size]
            self.by_group += SliceCounts.count(codes, old_right, new_right, len(self.groups.names))
        for kind, indices in flipped_indices(old_pred, new_pred, labels).items():
            self.flips[kind].append(indices + start)

    def _sum_distances(self, chunk: PairChunk) -> None:
        """SChurn and the prediction difference of two models, whose deviations from their
        mean are ±(p_old − p_new)/2: Δ1 = ½‖p_old − p_new‖₁, Δ2 = ½‖·‖₂, Δ^L_1 as below."""
        label_total = chunk.old_label_prob + chunk.new_label_prob
        label_share = np.divide(np.abs(chunk.old_label_prob - chunk.new_label_prob), label_total,
                                out=np.zeros_like(label_total), where=label_total > 0)
        for key, values in (("schurn", 0.5 * chunk.schurn), ("delta_1", 0.5 * chunk.delta_l1_sum),
                            ("delta_2", 0.5 * np.sqrt(chunk.delta_l2_squared)),
                            ("delta_l1", label_share)):
            self.sums[key] += float(values.sum(dtype=np.float64))

    def report(self) -> dict:
        """The JSON-ready report of everything tallied."""
        n, flips = self.n, self._flips()
        return {
            **label_entries(self.counts, self.classes, self.by_group, self.groups,
                            {kind: flips[kind] for kind in ("negative", "positive")}),
            "labels_only": False,
            "schurn": self.sums["schurn"] / n,
            "schurn_alpha": self.alpha,
            "confidence": self._confidence_summary(flips),
            "displacement": self._displacement_summary(flips["negative"]),
            "flip_rank": flip_rank_summary(flips["rank"]),
            "prediction_difference": {
                **{key: self.sums[key] / n for key in ("delta_1", "delta_2", "delta_l1")},
                "delta_h": self.counts.changed / n,
            },
        }

    def plot_values(self) -> PlotValues:
        """The per-sample values of everything tallied, for the HTML report's plots."""
        flips = self._flips()
        return PlotValues(self.counts, {kind: flips[kind] for kind in ("negative", "positive")},
                          self.kept, **self.per_sample)

    def _flips(self) -> dict[str, np.ndarray]:
        return {key: np.concatenate(parts) for key, parts in self.flips.items()}

    def _confidence_summary(self, flips: dict[str, np.ndarray]) -> dict:
        negative = flips["negative"]
        return {
            "old_mean_gap": self.sums["old_gap"] / self.n,
            "new_mean_gap": self.sums["new_gap"] / self.n,
            "old_ece": float(np.abs(self.ece["old"]).sum() / self.n),
            "new_ece": float(np.abs(self.ece["new"]).sum() / self.n),
            "negative_flips_old_gap": describe(self.per_sample["old_gap"][negative]),
            "negative_flips_new_gap": describe(self.per_sample["new_gap"][negative]),
        }

    def _displacement_summary(self, negative: np.ndarray) -> dict:
        displacement = self.per_sample["displacement"]
        return {
            "all": describe(displacement),
            "negative_flips": describe(displacement[negative]),
            "kept": describe(displacement[self.kept]),
        }


def label_entries(counts: FlipCounts, classes: SliceCounts, by_group: SliceCounts,
                  groups: Slices | None, flips: dict[str, np.ndarray]) -> dict:
    """The report's entries that predicted labels alone determine: counts, rates, intervals,
    McNemar, the per-class (and per-group) tables and the flipped indices."""
    n = counts.n
    report = {
        "n": n,
        "num_classes": len(classes.n),
        **counts.rates(),
        "nfr_mc": counts.nfr_mc,
        "negative_flips": counts.negative_flips,
        "positive_flips": counts.positive_flips,
        "both_wrong": counts.both_wrong,
        "both_wrong_changed": counts.both_wrong_changed,
        "nfr_ci": list(wilson_interval(counts.negative_flips, n)),
        "pfr_ci": list(wilson_interval(counts.positive_flips, n)),
        "churn_ci": list(wilson_interval(counts.changed, n)),
        "mcnemar_p": mcnemar_one_sided_p(counts.negative_flips, counts.positive_flips),
        "per_class": [{"class": c, **classes.row(c)} for c in range(len(classes.n))],
        "flipped_indices": {kind: indices.tolist() for kind, indices in flips.items()},
    }
    if groups:
        report["per_group"] = group_rows(by_group, groups.names)
    return report


SCORE_KEYS_WITHOUT_SCORES = {"schurn": None, "schurn_alpha": None, "confidence": None,
                             "displacement": None, "flip_rank": None}


def compare_labels(old_pred: np.ndarray, new_pred: np.ndarray, labels: np.ndarray,
                   num_classes: int, *, groups: np.ndarray | None = None) -> dict:
    """The report of a pair known by predicted labels only (N,) each: every entry of
    `compare_logits` that labels determine; the entries that need scores are None."""
    labels, old_pred, new_pred = (np.asarray(a, dtype=np.int64)
                                  for a in (labels, old_pred, new_pred))
    slices = Slices.of(groups, labels.size)
    old_right, new_right = old_pred == labels, new_pred == labels
    by_group = (SliceCounts.count(slices.codes, old_right, new_right, len(slices.names))
                if slices else SliceCounts.zeros(0))
    counts = count_flips(old_pred, new_pred, labels)
    return {
        **label_entries(counts, SliceCounts.count(labels, old_right, new_right, num_classes),
                        by_group, slices, flipped_indices(old_pred, new_pred, labels)),
        "labels_only": True, **SCORE_KEYS_WITHOUT_SCORES,
        "prediction_difference": {"delta_1": None, "delta_2": None, "delta_l1": None,
                                  "delta_h": counts.changed / counts.n},
    }


def flip_rank_summary(ranks: np.ndarray) -> dict:
    """Summary and histogram of the negative flips' ranks among the old logits."""
    histogram = np.bincount(ranks, minlength=2)[1:] if ranks.size else np.zeros(0, int)
    return {
        "summary": describe(ranks.astype(np.float64)),
        "counts": {str(rank): int(c) for rank, c in enumerate(histogram, start=1) if c},
    }


def group_rows(counts: SliceCounts, names: list) -> list[dict]:
    """The per-group table: the per-class numbers plus Wilson intervals of NFR and PFR."""
    rows = []
    for index, name in enumerate(names):
        n = int(counts.n[index])
        rows.append({"group": name, **counts.row(index),
                     "nfr_ci": list(wilson_interval(int(counts.negative_flips[index]), n)),
                     "pfr_ci": list(wilson_interval(int(counts.positive_flips[index]), n))})
    return rows


@dataclass(frozen=True, eq=False)
class PairAnalysis:
    """An old/new comparison (arrays or memory-mapped `.npy` logits): `to_dict` is
    `compare_logits`'s report and `values` what its plots draw, both from one streamed pass;
    the logits stay with it for the flip gallery."""

    old_logits: np.ndarray
    new_logits: np.ndarray
    labels: np.ndarray
    schurn_alpha: float = 1.0

    def __post_init__(self) -> None:
        check_pair(self.old_logits, self.new_logits, self.labels)

    @cached_property
    def _measured(self) -> tuple[dict, PlotValues]:
        return measure_pair(self.old_logits, self.new_logits, self.labels, self.schurn_alpha)

    @property
    def values(self) -> PlotValues:
        return self._measured[1]

    def to_dict(self) -> dict:
        """All numbers of `flipgate compare --json`."""
        return self._measured[0]
