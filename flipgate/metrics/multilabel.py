"""Every number of one old/new pair of multi-label classifiers (docs/metrics.md §Multi-label
pair metrics), ready for JSON.

y[n, j] is 1 when sample n has label j; a version's decision ŷ[n, j] is whether its
probability of label j exceeds the label's threshold (a labels-only version gives ŷ itself).
A (sample, label) pair is right when ŷ = y; a negative flip is a pair the old version got
right and the new one gets wrong: a lost positive (y = 1, old 1, new 0) or a new false alarm
(y = 0, old 0, new 1).

`compare_multilabel` streams over the samples (`chunk_size` rows of each (N, L) array at a
time, arrays or memory-mapped files): it keeps per label the counts of the eight
(y, ŷ_old, ŷ_new) cells and the sums of the score-based figures, per sample only histograms
(how many samples lost k labels) and the indices of each label's negative and positive
flips (which a per-label cost policy weighs, flipgate.metrics.cost.label_update_cost). The pooled
intervals are a bootstrap over samples drawn from those histograms: the pooled rates are
means of per-sample counts, so resampling samples is drawing N counts from their empirical
distribution, a multinomial over the values 0..L (the same distribution as resampling the
samples themselves, at a cost that does not grow with N). With `groups`, `GroupTally` adds
per group the counts its rows need (a few integers per group, and per group and label its
negative flips).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flipgate.metrics.chunks import CHUNK_ELEMENTS, chunk_rows, release, sample_ranges
from flipgate.metrics.report import Slices
from flipgate.metrics.stats import mcnemar_one_sided_p, wilson_interval
from flipgate.progress import Progress

DEFAULT_THRESHOLD = 0.5
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
PER_SAMPLE = ("negative", "positive", "changed", "lost_positives")  # counts kept per sample
GROUP_WORST_LABELS = 3  # labels named per group, the most negative flips first


def predicted_labels(probabilities: np.ndarray,
                     thresholds: Sequence[float] | None = None) -> np.ndarray:
    """ŷ (N, L) bool: whether each probability exceeds its label's threshold (0.5 default)."""
    limit = DEFAULT_THRESHOLD if thresholds is None else np.asarray(thresholds, np.float64)
    return np.asarray(probabilities) > limit


def compare_multilabel(
    y: np.ndarray, old: np.ndarray, new: np.ndarray, *,
    thresholds: tuple[Sequence[float] | None, Sequence[float] | None] = (None, None),
    label_names: Sequence[str] | None = None, groups: np.ndarray | None = None,
    schurn_alpha: float = 1.0, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
    chunk_size: int | None = None, progress: Progress | None = None,
) -> dict:
    """The multi-label report of docs/metrics.md for one pair, as a JSON-ready dict.

    `old` and `new` are each a version's probabilities (float (N, L), thresholded with its
    `thresholds`, 0.5 per label by default) or its decisions (bool or 0/1 integers (N, L),
    labels only: the score-based figures are then None). The pooled intervals come from
    `resamples` bootstrap draws seeded with `seed`; `groups` (one string or integer per
    sample) adds the `per_group` table."""
    check_multilabel_pair(y, old, new, thresholds)
    if schurn_alpha <= 0:
        raise ValueError(f"alpha must be positive, got {schurn_alpha}")
    n, num_labels = y.shape
    with_scores = all(np.issubdtype(side.dtype, np.floating) for side in (old, new))
    tally = LabelTally(n, num_labels, schurn_alpha if with_scores else None,
                       Slices.of(groups, n))
    rows = chunk_rows(num_labels, chunk_size, CHUNK_ELEMENTS)
    for start, stop in sample_ranges(n, rows):
        sides = [_decisions(side[start:stop], limit) for side, limit in zip(
            (old, new), thresholds, strict=True)]
        tally.add(start, np.asarray(y[start:stop], dtype=bool), *sides)
        for array in (y, old, new):
            release(array, start, stop)
        if progress:
            progress(stop, n)
    names = list(label_names) if label_names else [str(j) for j in range(num_labels)]
    return tally.report(names, np.random.default_rng(seed), resamples)


def check_multilabel_pair(y: np.ndarray, old: np.ndarray, new: np.ndarray,
                          thresholds: tuple[Sequence[float] | None, ...]) -> None:
    """y, old and new of one shape (N, L), N, L >= 1; a threshold per label where given."""
    shape = y.shape
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1 or old.shape != shape \
            or new.shape != shape:
        raise ValueError(f"y, old and new must share one (N, L) shape with N, L >= 1, got "
                         f"{shape}, {old.shape} and {new.shape}")
    for side, limit in zip((old, new), thresholds, strict=True):
        if limit is not None and len(limit) != shape[1]:
            raise ValueError(f"{len(limit)} thresholds for {shape[1]} labels")
        if limit is not None and not np.issubdtype(side.dtype, np.floating):
            raise ValueError("thresholds apply to probabilities, not to decisions")


def _decisions(chunk: np.ndarray, thresholds: Sequence[float] | None
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """A chunk of a side as (decisions, probabilities or None)."""
    if np.issubdtype(chunk.dtype, np.floating):
        probabilities = np.asarray(chunk, dtype=np.float64)
        return predicted_labels(probabilities, thresholds), probabilities
    return np.asarray(chunk) != 0, None


def decided(side: np.ndarray, thresholds: Sequence[float] | None = None) -> np.ndarray:
    """A version's decisions ŷ (N, L) bool: its probabilities thresholded, or its 0/1
    decisions as they are."""
    return _decisions(side, thresholds)[0]


@dataclass(frozen=True)
class Cells:
    """Per label, the count of pairs in each (y, old, new) cell: counts[j, y, old, new]."""

    counts: np.ndarray  # (L, 2, 2, 2) int64

    def sum(self, y: int | None = None, old: int | None = None,
            new: int | None = None) -> np.ndarray:
        """Per label, the pairs in the cells that match the values given (None: any)."""
        picked = self.counts[:, *(slice(None) if v is None else v for v in (y, old, new))]
        return picked.reshape(picked.shape[0], -1).sum(axis=1)

    @property
    def lost_positives(self) -> np.ndarray:
        return self.sum(1, 1, 0)

    @property
    def new_false_alarms(self) -> np.ndarray:
        return self.sum(0, 0, 1)

    @property
    def negative_flips(self) -> np.ndarray:
        return self.lost_positives + self.new_false_alarms

    @property
    def positive_flips(self) -> np.ndarray:
        return self.sum(1, 0, 1) + self.sum(0, 1, 0)

    @property
    def changed(self) -> np.ndarray:
        return self.sum(None, 1, 0) + self.sum(None, 0, 1)

    def errors(self, model: str) -> np.ndarray:
        """Per label, the pairs `model` ("old" or "new") gets wrong."""
        return self.false_positives(model) + self.false_negatives(model)

    def true_positives(self, model: str) -> np.ndarray:
        return self.sum(1, **{model: 1})

    def false_positives(self, model: str) -> np.ndarray:
        return self.sum(0, **{model: 1})

    def false_negatives(self, model: str) -> np.ndarray:
        return self.sum(1, **{model: 0})


class LabelTally:
    """Cell counts, per-sample histograms, score sums and flipped indices, chunk by chunk."""

    def __init__(self, n: int, num_labels: int, alpha: float | None,
                 groups: Slices | None = None) -> None:
        self.n, self.num_labels, self.alpha = n, num_labels, alpha
        self.groups = GroupTally(groups, num_labels) if groups else None
        self.counts = np.zeros((num_labels, 8), dtype=np.int64)
        self.histograms = {key: np.zeros(num_labels + 1, dtype=np.int64) for key in PER_SAMPLE}
        self.exact = {"old": 0, "new": 0, "flips": 0, "gains": 0}
        self.sums = {key: np.zeros(num_labels) for key in ("schurn", "difference")}
        self.flipped: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
            "negative": [], "positive": []}  # (samples, labels) of each chunk

    def add(self, start: int, y: np.ndarray, old: tuple[np.ndarray, np.ndarray | None],
            new: tuple[np.ndarray, np.ndarray | None]) -> None:
        """Fold the chunk of samples [start, start + len(y)) into the tally."""
        (old_pred, old_prob), (new_pred, new_prob) = old, new
        cells = 4 * y + 2 * old_pred + new_pred
        offsets = 8 * np.arange(self.num_labels)
        self.counts += np.bincount((cells + offsets).ravel(),
                                   minlength=8 * self.num_labels).reshape(-1, 8)
        old_right, new_right = old_pred == y, new_pred == y
        negative = old_right & ~new_right
        per_sample = {"negative": negative, "positive": ~old_right & new_right,
                      "changed": old_pred != new_pred, "lost_positives": negative & y}
        for key, mask in per_sample.items():
            self.histograms[key] += np.bincount(mask.sum(axis=1),
                                                minlength=self.num_labels + 1)
        self._count_exact(old_right.all(axis=1), new_right.all(axis=1))
        for kind, flipped in self.flipped.items():
            samples, labels = np.nonzero(per_sample[kind])
            flipped.append((samples + start, labels))
        if self.groups:
            self.groups.add(start, per_sample, np.nonzero(negative), (~old_right, ~new_right))
        if self.alpha is not None:
            self.sums["schurn"] += bernoulli_schurn(old_prob, new_prob, self.alpha).sum(axis=0)
            self.sums["difference"] += np.abs(old_prob - new_prob).sum(axis=0)

    def _count_exact(self, old_exact: np.ndarray, new_exact: np.ndarray) -> None:
        self.exact["old"] += int(old_exact.sum())
        self.exact["new"] += int(new_exact.sum())
        self.exact["flips"] += int((old_exact & ~new_exact).sum())
        self.exact["gains"] += int((~old_exact & new_exact).sum())

    def flipped_indices(self, kind: str = "negative") -> list[np.ndarray]:
        """Per label, the samples whose label turned wrong ("negative") or right
        ("positive"), ascending."""
        samples = np.concatenate([s for s, _ in self.flipped[kind]])
        labels = np.concatenate([lab for _, lab in self.flipped[kind]])
        order = np.argsort(labels, kind="stable")  # samples ascend within each label
        bounds = np.cumsum(np.bincount(labels, minlength=self.num_labels))[:-1]
        return np.split(samples[order], bounds)

    def report(self, names: list[str], rng: np.random.Generator, resamples: int) -> dict:
        """The JSON-ready report of everything tallied."""
        cells = Cells(self.counts.reshape(-1, 2, 2, 2))
        return {
            "multilabel": True,
            "n": self.n,
            "num_labels": self.num_labels,
            "label_names": names,
            "labels_only": self.alpha is None,
            "schurn_alpha": self.alpha,
            "per_sample": self._per_sample(),
            "pooled": self._pooled(cells, rng, resamples),
            "quality": {model: quality(cells, model, self.exact[model], self.n)
                        for model in ("old", "new")},
            "per_label": self._label_rows(cells, names),
            "flipped_indices": self._indices_by_name(names, "negative"),
            "fixed_indices": self._indices_by_name(names, "positive"),
            **({"per_group": self.groups.rows(names)} if self.groups else {}),
        }

    def _indices_by_name(self, names: list[str], kind: str) -> dict[str, list[int]]:
        return {name: indices.tolist()
                for name, indices in zip(names, self.flipped_indices(kind), strict=True)}

    def _per_sample(self) -> dict:
        n, negative = self.n, self.histograms["negative"]
        hit = n - int(negative[0])
        lost = float(negative @ np.arange(self.num_labels + 1))
        entries = {"nfr": hit, "pfr": n - int(self.histograms["positive"][0]),
                   "churn": n - int(self.histograms["changed"][0]),
                   "exact_match_flips": self.exact["flips"],
                   "exact_match_gains": self.exact["gains"]}
        return {
            **{key: count / n for key, count in entries.items()},
            **{f"{key}_ci": list(wilson_interval(entries[key], n))
               for key in ("nfr", "pfr", "churn", "exact_match_flips")},
            "samples_with_negative_flips": hit,
            "mean_labels_lost": lost / n,
            "mean_labels_lost_when_hit": lost / hit if hit else None,
            "mean_lost_positives": float(self.histograms["lost_positives"]
                                         @ np.arange(self.num_labels + 1)) / n,
        }

    def _pooled(self, cells: Cells, rng: np.random.Generator, resamples: int) -> dict:
        pairs = self.n * self.num_labels
        counts = {"negative_flips": int(cells.negative_flips.sum()),
                  "positive_flips": int(cells.positive_flips.sum()),
                  "changed": int(cells.changed.sum())}
        scores = {} if self.alpha is None else {
            key: float(self.sums[key].sum()) / pairs for key in ("schurn", "difference")}
        return {
            "pairs": pairs,
            **counts,
            "lost_positives": int(cells.lost_positives.sum()),
            "new_false_alarms": int(cells.new_false_alarms.sum()),
            "nfr": counts["negative_flips"] / pairs,
            "pfr": counts["positive_flips"] / pairs,
            "churn": counts["changed"] / pairs,
            "nfr_ci": self._bootstrap("negative", rng, resamples),
            "churn_ci": self._bootstrap("changed", rng, resamples),
            "bootstrap": {"resamples": resamples, "confidence": CONFIDENCE},
            "schurn": scores.get("schurn"),
            "prediction_difference": scores.get("difference"),
        }

    def _bootstrap(self, key: str, rng: np.random.Generator, resamples: int) -> list[float]:
        """The percentile interval of a pooled rate over `resamples` resamples of samples."""
        histogram = self.histograms[key]
        draws = rng.multinomial(self.n, histogram / self.n, size=resamples)
        rates = draws @ np.arange(self.num_labels + 1) / (self.n * self.num_labels)
        tail = 100 * (1 - CONFIDENCE) / 2
        return [float(np.percentile(rates, tail)), float(np.percentile(rates, 100 - tail))]

    def _label_rows(self, cells: Cells, names: list[str]) -> list[dict]:
        """One row per label, in label order."""
        n = self.n
        counts = {"support": cells.sum(1), "negative_flips": cells.negative_flips,
                  "lost_positives": cells.lost_positives,
                  "new_false_alarms": cells.new_false_alarms,
                  "positive_flips": cells.positive_flips, "changed": cells.changed,
                  "errors_old": cells.errors("old"), "errors_new": cells.errors("new")}
        f1 = {model: label_f1(cells, model) for model in ("old", "new")}
        rows = []
        for j, name in enumerate(names):
            count = {key: int(values[j]) for key, values in counts.items()}
            rows.append({
                "label": j, "name": name, "support": count["support"],
                **rate("nfr", count["negative_flips"], n),
                **{key: count[key] for key in ("negative_flips", "lost_positives",
                                               "new_false_alarms")},
                **rate("pfr", count["positive_flips"], n),
                "positive_flips": count["positive_flips"],
                **rate("churn", count["changed"], n),
                "mcnemar_p": mcnemar_one_sided_p(count["negative_flips"],
                                                 count["positive_flips"]),
                "er_old": count["errors_old"] / n, "er_new": count["errors_new"] / n,
                "f1_old": f1["old"][j], "f1_new": f1["new"][j],
                **{key: None if self.alpha is None else float(self.sums[total][j]) / n
                   for key, total in (("schurn", "schurn"),
                                      ("prediction_difference", "difference"))},
            })
        return rows


def rate(key: str, count: int, n: int) -> dict:
    """A rate over `n` samples and its Wilson interval."""
    return {key: count / n, f"{key}_ci": list(wilson_interval(count, n))}


class GroupTally:
    """Per group: its samples, those with a label turned wrong, turned right or changed, its
    (sample, label) pairs turned wrong and wrong under each version, and per label its
    negative flips."""

    def __init__(self, slices: Slices, num_labels: int) -> None:
        self.slices, self.num_labels = slices, num_labels
        size = len(slices.names)
        self.samples = {key: np.zeros(size, np.int64)
                        for key in ("n", "negative", "positive", "changed")}
        self.pairs = {key: np.zeros(size, np.int64)
                      for key in ("negative", "errors_old", "errors_new")}
        self.label_flips = np.zeros((size, num_labels), np.int64)

    def add(self, start: int, per_sample: dict[str, np.ndarray],
            flips: tuple[np.ndarray, np.ndarray], wrong: tuple[np.ndarray, np.ndarray]) -> None:
        """Fold a chunk in: its per-sample masks (N_chunk, L), its negative flips (chunk rows,
        labels) and each version's wrong pairs (N_chunk, L)."""
        codes = self.slices.codes[start : start + wrong[0].shape[0]]
        size = len(self.slices.names)
        self.samples["n"] += np.bincount(codes, minlength=size)
        for key in ("negative", "positive", "changed"):
            self.samples[key] += np.bincount(codes[per_sample[key].any(axis=1)], minlength=size)
        for key, mask in zip(self.pairs, (per_sample["negative"], *wrong), strict=True):
            self.pairs[key] += np.bincount(codes, weights=mask.sum(axis=1),
                                           minlength=size).astype(np.int64)
        rows, labels = flips
        self.label_flips += np.bincount(codes[rows] * self.num_labels + labels,
                                        minlength=size * self.num_labels).reshape(size, -1)

    def rows(self, names: list[str]) -> list[dict]:
        """The per-group table: NFR_sample, PFR_sample and churn_sample with their Wilson
        intervals, the pooled NFR, both versions' Hamming loss (`er_old`, `er_new`) and the
        labels that lose the most."""
        rows = []
        for i, group in enumerate(self.slices.names):
            counts = {key: int(values[i]) for key, values in self.samples.items()}
            n, pairs = counts["n"], counts["n"] * self.num_labels
            rows.append({
                "group": group, "n": n, **rate("nfr", counts["negative"], n),
                **rate("pfr", counts["positive"], n), **rate("churn", counts["changed"], n),
                "negative_flips": counts["negative"], "positive_flips": counts["positive"],
                "pooled_nfr": int(self.pairs["negative"][i]) / pairs,
                "er_old": int(self.pairs["errors_old"][i]) / pairs,
                "er_new": int(self.pairs["errors_new"][i]) / pairs,
                "worst_labels": self._worst_labels(i, names, n),
            })
        return rows

    def _worst_labels(self, group: int, names: list[str], n: int) -> list[dict]:
        """The GROUP_WORST_LABELS labels of a group with the most negative flips (some)."""
        flips = self.label_flips[group]
        order = np.argsort(-flips, kind="stable")[:GROUP_WORST_LABELS]
        return [{"name": names[j], "negative_flips": int(flips[j]), "nfr": int(flips[j]) / n}
                for j in order if flips[j]]


def label_f1(cells: Cells, model: str) -> list[float | None]:
    """F1 of each label under `model`; None where the label is neither present nor predicted
    (2·TP + FP + FN = 0)."""
    tp, fp, fn = (cells.true_positives(model), cells.false_positives(model),
                  cells.false_negatives(model))
    return [None if 2 * t + p + f == 0 else 2 * int(t) / int(2 * t + p + f)
            for t, p, f in zip(tp, fp, fn, strict=True)]


def quality(cells: Cells, model: str, exact: int, n: int) -> dict:
    """Hamming loss, subset accuracy, micro- and macro-F1 of `model` ("old" or "new";
    `exact`: the samples whose whole label set it gets right)."""
    tp, fp, fn = (int(counts.sum()) for counts in (
        cells.true_positives(model), cells.false_positives(model), cells.false_negatives(model)))
    defined = [f1 for f1 in label_f1(cells, model) if f1 is not None]
    return {
        "hamming_loss": (fp + fn) / (n * cells.counts.shape[0]),
        "subset_accuracy": exact / n,
        "micro_f1": 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else None,
        "macro_f1": sum(defined) / len(defined) if defined else None,
    }


def bernoulli_schurn(old: np.ndarray, new: np.ndarray, alpha: float) -> np.ndarray:
    """SChurn_α of each (sample, label) pair: ½‖(q_old / max q_old)^α − (q_new / max
    q_new)^α‖₁ with q = (1 − p, p), the label's Bernoulli distribution."""
    def scaled(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        top = np.maximum(p, 1.0 - p)
        return ((1.0 - p) / top) ** alpha, (p / top) ** alpha

    (old_absent, old_present), (new_absent, new_present) = scaled(old), scaled(new)
    return 0.5 * (np.abs(old_absent - new_absent) + np.abs(old_present - new_present))
