"""The report of an old/new pair on a traffic set (an eval set without labels):
churn and what needs no labels, exact; NFR and PFR bounded by churn, exact once every
disagreement is labelled, else estimated from the longest labelled prefix of the
disagreements' export order (docs/traffic.md)."""

import hashlib
from dataclasses import dataclass

import numpy as np

from flipgate.metrics.displacement import describe
from flipgate.metrics.report import Slices, compare_labels, measure_pair
from flipgate.metrics.stats import wilson_interval

ORDER_DOMAIN = b"flipgate disagreements v1\n"  # the seed digest's first bytes
CONFIDENCE = 0.95
UNLABELLED = -1  # the label of a sample nobody labelled yet
WHY_NULL = ("traffic set: the samples have no labels, so the entries that need them (error "
            "rates, flips, per-class numbers) are null; NFR lies within nfr_bounds, and is "
            "exact once every disagreement is labelled (docs/traffic.md)")
NEED_LABELS = ("er_old", "er_new", "nfr", "pfr", "rel_nfr", "nfi", "btc", "bec",
               "churn_old_correct", "churn_old_incorrect", "nfr_mc", "negative_flips",
               "positive_flips", "both_wrong", "both_wrong_changed", "nfr_ci", "pfr_ci",
               "mcnemar_p", "per_class", "flipped_indices")


def order_seed(set_sha256: str, old_pred: np.ndarray, new_pred: np.ndarray) -> int:
    """The export order's seed: the first 8 bytes, big-endian, of SHA-256 over ORDER_DOMAIN,
    the set's sha256 (64 hex characters) and both predicted classes as little-endian int64
    (multi-label: both 0/1 decision matrices, row by row)."""
    digest = hashlib.sha256(ORDER_DOMAIN + set_sha256.encode())
    for pred in (old_pred, new_pred):
        digest.update(np.ascontiguousarray(pred, dtype="<i8").tobytes())
    return int.from_bytes(digest.digest()[:8], "big")


def splitmix64(seed: int, indices: np.ndarray) -> np.ndarray:
    """SplitMix64's output for the states seed + (i + 1)·0x9E3779B97F4A7C15 (mod 2^64)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (indices.astype(np.uint64) + np.uint64(1)) \
            * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def disagreement_order(old_pred: np.ndarray, new_pred: np.ndarray, set_sha256: str) -> np.ndarray:
    """The indices of the samples whose predicted class differs (multi-label: the decision
    matrices (N, L) differ on any label), in the export order: sorted by
    splitmix64(order_seed, index) (ties by index), a uniform random order that anyone can
    compute again, so that every prefix is a uniform random sample of the disagreements."""
    old_pred, new_pred = np.asarray(old_pred), np.asarray(new_pred)
    changed = np.flatnonzero((old_pred != new_pred).reshape(old_pred.shape[0], -1).any(axis=1))
    keys = splitmix64(order_seed(set_sha256, old_pred, new_pred), changed)
    return changed[np.lexsort((changed, keys))]


def hypergeometric_cdf(x: int, population: int, successes: int, draws: int) -> float:
    """P(X <= x) for X the successes among `draws` drawn without replacement from
    `population` items of which `successes` are successes: the probabilities of the shorter
    tail summed in log space, vectorized (scipy.special, imported when needed; importing
    scipy.stats would cost several times as long)."""
    from scipy.special import gammaln, logsumexp

    low, high = max(0, draws - (population - successes)), min(successes, draws)
    if x < low:
        return 0.0
    if x >= high:
        return 1.0
    below = x - low + 1 <= high - x
    counts = np.arange(low, x + 1) if below else np.arange(x + 1, high + 1)

    def log_choose(n, k):
        return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)

    log_terms = (log_choose(successes, counts) + log_choose(population - successes,
                                                            draws - counts)
                 - log_choose(population, draws))
    tail = float(np.exp(logsumexp(log_terms)))
    return min(1.0, tail) if below else max(0.0, 1.0 - tail)


def hypergeometric_interval(x: int, draws: int, population: int,
                            confidence: float = CONFIDENCE) -> tuple[int, int]:
    """The exact (Clopper-Pearson style) interval for the number of successes in a
    population from `x` successes among `draws` drawn uniformly without replacement: the
    counts M for which neither tail of the observed x has probability below (1 − confidence)/2.
    Exact (x, x) when every item was drawn."""
    tail = (1 - confidence) / 2
    least, most = x, population - (draws - x)

    def first(low: int, high: int, fits) -> int:  # smallest M in [low, high] that fits
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if fits(middle) else (middle + 1, high)
        return low

    lower = first(least, most, lambda m: 1 - hypergeometric_cdf(x - 1, population, m, draws)
                  > tail)
    upper = first(least, most, lambda m: hypergeometric_cdf(x, population, m, draws) <= tail)
    if hypergeometric_cdf(x, population, upper, draws) <= tail:
        upper -= 1
    return lower, max(lower, upper)


@dataclass(frozen=True)
class LabelledPrefix:
    """What the labels of a prefix of the export order say about the disagreements."""

    disagreements: int  # D
    labelled: int  # labelled disagreements, anywhere in the order
    prefix: int  # k: the longest prefix of the order that is labelled
    negative: int  # negative flips in the prefix
    positive: int  # positive flips in the prefix
    known_negative: int  # negative flips among every labelled disagreement
    known_positive: int

    @classmethod
    def of(cls, order: np.ndarray, old_pred: np.ndarray, new_pred: np.ndarray,
           labels: np.ndarray) -> "LabelledPrefix":
        """The prefix of `order` (disagreement indices) labelled in `labels` (UNLABELLED where
        no label is known)."""
        truth, old, new = labels[order], old_pred[order], new_pred[order]
        known = truth != UNLABELLED
        return cls.of_flips(known, (old == truth) & known, (new == truth) & known)

    @classmethod
    def of_flips(cls, known: np.ndarray, negative: np.ndarray,
                 positive: np.ndarray) -> "LabelledPrefix":
        """The prefix of the export order whose samples are `known` (labelled), from whether
        each of them, in that order, is a negative or a positive flip."""
        prefix = int(np.argmin(known)) if not known.all() else int(known.size)
        return cls(int(known.size), int(known.sum()), prefix, int(negative[:prefix].sum()),
                   int(positive[:prefix].sum()), int(negative.sum()), int(positive.sum()))

    @classmethod
    def from_report(cls, entry: dict) -> "LabelledPrefix":
        """The prefix that a traffic report's `disagreements` entry describes."""
        return cls(entry["count"], entry["labelled"], entry["labelled_prefix"],
                   entry["negative_flips_in_prefix"], entry["positive_flips_in_prefix"],
                   entry["negative_flips_known"], entry["positive_flips_known"])

    @property
    def complete(self) -> bool:
        return self.prefix == self.disagreements

    def count_interval(self, kind: str, confidence: float = CONFIDENCE) -> tuple[int, int]:
        """The interval of the number of "negative" or "positive" flips among all
        disagreements: the hypergeometric interval from the prefix, within the sure bounds
        (the flips known plus every unlabelled disagreement at most)."""
        sure_low = getattr(self, f"known_{kind}")
        sure_high = sure_low + self.disagreements - self.labelled
        if self.prefix == 0:
            return sure_low, sure_high
        low, high = hypergeometric_interval(getattr(self, kind), self.prefix,
                                            self.disagreements, confidence)
        return max(low, sure_low), min(high, sure_high)

    def estimate(self, kind: str) -> float | None:
        """The estimated count of "negative" or "positive" flips: D × their share in the
        prefix (None with no prefix)."""
        return self.disagreements * getattr(self, kind) / self.prefix if self.prefix else None

    def labels_to_decide(self, limit_count: float, confidence: float = CONFIDENCE) -> int:
        """How many more disagreements (in the export order) would need labels for the
        negative-flip interval to end on one side of `limit_count` flips, if the share seen
        in the prefix held: 0 when it does already."""
        def decided(draws: int, negative: int) -> bool:
            low, high = hypergeometric_interval(negative, draws, self.disagreements, confidence)
            return high <= limit_count or low > limit_count

        low, high = self.count_interval("negative", confidence)
        if high <= limit_count or low > limit_count:
            return 0
        share = self.negative / self.prefix if self.prefix else 0.5
        lo, hi = self.prefix + 1, self.disagreements
        while lo < hi:
            middle = (lo + hi) // 2
            if decided(middle, round(share * middle)):
                hi = middle
            else:
                lo = middle + 1
        return lo - self.prefix


def traffic_report(old_pred: np.ndarray, new_pred: np.ndarray, *, num_classes: int,
                   order: np.ndarray, class_names: list[str] | None = None,
                   groups: np.ndarray | None = None, scores: tuple | None = None,
                   labels: np.ndarray | None = None, schurn_alpha: float = 1.0) -> dict:
    """The JSON-ready report of old → new on a traffic set of N samples: predicted classes
    (N,), the disagreements' export `order`, optionally both logits (`scores`) and the labels
    known so far (N,, UNLABELLED where unknown)."""
    old_pred, new_pred = (np.asarray(pred, dtype=np.int64) for pred in (old_pred, new_pred))
    n = old_pred.size
    labels = np.full(n, UNLABELLED, np.int64) if labels is None else labels
    every_label = bool((labels != UNLABELLED).all())
    if every_label:  # every sample labelled: the labeled report
        report = _labeled_report(old_pred, new_pred, labels, num_classes, groups, scores,
                                 schurn_alpha)
    else:
        report = {**dict.fromkeys(NEED_LABELS), "n": n, "num_classes": num_classes,
                  **_score_entries(old_pred, new_pred, scores, schurn_alpha)}
    changed = old_pred != new_pred
    prefix = LabelledPrefix.of(order, old_pred, new_pred, labels)
    report.update(
        traffic=True, labels_missing=None if every_label else WHY_NULL,
        changed=int(changed.sum()), churn=float(changed.mean()),
        churn_ci=list(wilson_interval(int(changed.sum()), n)),
        changes=change_table(old_pred, new_pred, class_names),
        per_group_churn=group_churn(changed, groups), **label_estimates(prefix, n))
    return report


def _labeled_report(old_pred, new_pred, labels, num_classes, groups, scores, alpha) -> dict:
    """The report of a traffic set whose every sample is labelled (as for an eval set)."""
    if scores is None:
        return compare_labels(old_pred, new_pred, labels, num_classes, groups=groups)
    return measure_pair(*scores, labels, alpha, groups=groups)[0]


def _score_entries(old_pred: np.ndarray, new_pred: np.ndarray, scores: tuple | None,
                   alpha: float) -> dict:
    """SChurn, the prediction difference and the confidence (top-1 minus top-2 probability)
    of every sample and of the changed ones: none of them needs labels (null without scores)."""
    delta_h = float((old_pred != new_pred).mean())
    if scores is None:
        return {"labels_only": True, "schurn": None, "schurn_alpha": None, "confidence": None,
                "prediction_difference": {"delta_1": None, "delta_2": None, "delta_l1": None,
                                          "delta_h": delta_h}}
    unknown = np.zeros(old_pred.size, dtype=np.int64)  # measure_pair's label entries unused
    report, values = measure_pair(*scores, unknown, alpha)
    changed = ~values.kept
    return {"labels_only": False, "schurn": report["schurn"], "schurn_alpha": alpha,
            "confidence": {"old_mean_gap": report["confidence"]["old_mean_gap"],
                           "new_mean_gap": report["confidence"]["new_mean_gap"],
                           "changed_old_gap": describe(values.old_gap[changed]),
                           "changed_new_gap": describe(values.new_gap[changed])},
            "prediction_difference": {**report["prediction_difference"], "delta_l1": None}}


def change_table(old_pred: np.ndarray, new_pred: np.ndarray,
                 class_names: list[str] | None) -> list[dict]:
    """The old-class × new-class table of the changed predictions, as rows of the cells that
    hold any, the largest first: {"old", "new", "old_name", "new_name", "count"}."""
    changed = old_pred != new_pred
    pairs, counts = np.unique(np.stack([old_pred[changed], new_pred[changed]]), axis=1,
                              return_counts=True)

    def name(column: int) -> str:
        return class_names[column] if class_names else str(column)

    rows = [{"old": int(old), "new": int(new), "old_name": name(int(old)),
             "new_name": name(int(new)), "count": int(count)}
            for (old, new), count in zip(pairs.T, counts, strict=True)]
    return sorted(rows, key=lambda row: (-row["count"], row["old"], row["new"]))


def group_churn(changed: np.ndarray, groups: np.ndarray | None) -> list[dict] | None:
    """Churn (count, rate, Wilson interval) per group of the set's `groups`, if any."""
    slices = Slices.of(groups, changed.size)
    if slices is None:
        return None
    n = np.bincount(slices.codes, minlength=len(slices.names))
    moved = np.bincount(slices.codes[changed], minlength=len(slices.names))
    return [{"group": name, "n": int(n[i]), "changed": int(moved[i]),
             "churn": float(moved[i] / n[i]),
             "churn_ci": list(wilson_interval(int(moved[i]), int(n[i])))}
            for i, name in enumerate(slices.names)]


def label_estimates(prefix: LabelledPrefix, n: int) -> dict:
    """NFR and PFR from the labelled disagreements: sure bounds, the interval from the
    longest labelled prefix and the estimate; exact once every disagreement is labelled."""
    entries: dict = {"er_difference": None, "disagreements": {
        "count": prefix.disagreements, "labelled": prefix.labelled,
        "labelled_prefix": prefix.prefix, "complete": prefix.complete,
        "negative_flips_in_prefix": prefix.negative,
        "positive_flips_in_prefix": prefix.positive,
        "negative_flips_known": prefix.known_negative,
        "positive_flips_known": prefix.known_positive}}
    for kind, rate in (("negative", "nfr"), ("positive", "pfr")):
        low, high = prefix.count_interval(kind)
        estimate = prefix.estimate(kind)
        known = getattr(prefix, f"known_{kind}")
        entries[f"{rate}_bounds"] = [known / n,
                                     (known + prefix.disagreements - prefix.labelled) / n]
        entries["disagreements"][f"{rate}_estimate"] = None if estimate is None else estimate / n
        entries["disagreements"][f"{rate}_interval"] = [low / n, high / n]
    if prefix.complete:
        entries.update(_exact_entries(prefix, n))
    return entries


def _exact_entries(prefix: LabelledPrefix, n: int) -> dict:
    """NFR, PFR and ER_new − ER_old once every disagreement is labelled (the agreements
    flip nothing): exact, and their degenerate intervals."""
    negative, positive = prefix.known_negative, prefix.known_positive
    return {"nfr": negative / n, "pfr": positive / n, "negative_flips": negative,
            "positive_flips": positive, "er_difference": (negative - positive) / n,
            "nfr_ci": [negative / n] * 2, "pfr_ci": [positive / n] * 2}

