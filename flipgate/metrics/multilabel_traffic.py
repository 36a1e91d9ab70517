"""The report of a multi-label old/new pair on a traffic set (docs/traffic.md, "Multi-label
lines"): churn per label, per sample and pooled, exact without labels; NFR_sample and
PFR_sample (the samples with at least one label turned wrong, right) bounded by
churn_sample, exact once every disagreement (a sample whose decisions differ on any label)
is labelled with its whole label set, else estimated from the longest labelled prefix of
the export order as the single-label NFR is (flipgate.metrics.traffic); with groups, churn
per group."""

from collections.abc import Sequence

import numpy as np

from flipgate.metrics.multilabel import GROUP_WORST_LABELS, compare_multilabel, decided
from flipgate.metrics.report import Slices
from flipgate.metrics.stats import wilson_interval
from flipgate.metrics.traffic import UNLABELLED, LabelledPrefix, group_churn, label_estimates

WHY_NULL = ("traffic set: the samples have no labels, so the entries that need them (flips, "
            "error rates, quality) are null; NFR_sample lies within nfr_bounds, and is exact "
            "once every disagreement is labelled (docs/traffic.md)")
EXACT_WHEN_LABELLED = ("nfr", "pfr", "negative_flips", "positive_flips", "nfr_ci", "pfr_ci")
LABEL_FREE = {  # what a multi-label report keeps without labels, by entry
    "per_label": ("label", "name", "churn", "churn_ci", "schurn", "prediction_difference"),
    "per_sample": ("churn", "churn_ci"),
    "pooled": ("pairs", "changed", "churn", "churn_ci", "bootstrap", "schurn",
               "prediction_difference"),
}


def unlabelled_label_sets(n: int, num_labels: int) -> np.ndarray:
    """The label matrix of a multi-label traffic set before any label: UNLABELLED rows."""
    return np.full((n, num_labels), UNLABELLED, dtype=np.int64)


def multilabel_traffic_report(
    old: np.ndarray, new: np.ndarray, *, order: np.ndarray,
    thresholds: tuple[Sequence[float] | None, Sequence[float] | None] = (None, None),
    label_names: Sequence[str] | None = None, labels: np.ndarray | None = None,
    groups: np.ndarray | None = None,
) -> dict:
    """The JSON-ready report of old → new on a multi-label traffic set: each side's
    probabilities (float (N, L), thresholded with its `thresholds`) or decisions (0/1
    (N, L)), the disagreements' export `order`, and the label sets known so far (N, L) of
    0/1, a whole row UNLABELLED where unknown; `groups` (one per sample) adds churn per
    group, and the labelled report's `per_group` once every sample is labelled. Its
    top-level traffic keys (`changed`, `churn`, `nfr`, `disagreements`, …) are per sample."""
    old_decided, new_decided = (decided(side, limit) for side, limit in zip(
        (old, new), thresholds, strict=True))
    n, num_labels = old_decided.shape
    labels = unlabelled_label_sets(n, num_labels) if labels is None else labels
    known = labels[:, 0] != UNLABELLED
    every_label = bool(known.all())
    full = compare_multilabel(np.where(known[:, None], labels, 0).astype(bool), old, new,
                              thresholds=thresholds, label_names=label_names,
                              groups=groups if every_label else None)
    report = full if every_label else _label_free(full)
    changed = old_decided != new_decided
    for row, count in zip(report["per_label"], changed.sum(axis=0).tolist(), strict=True):
        row["changed"] = count
    samples_changed = int(changed.any(axis=1).sum())
    report.update(
        traffic=True, labels_missing=None if every_label else WHY_NULL,
        changed=samples_changed, churn=samples_changed / n,
        churn_ci=list(wilson_interval(samples_changed, n)), **dict.fromkeys(EXACT_WHEN_LABELLED),
        per_group_churn=label_group_churn(changed, groups, report["label_names"]))
    report.update(label_estimates(_prefix(order, labels, old_decided, new_decided), n))
    report["er_difference"] = None  # NFR_sample − PFR_sample is no error rates' difference
    return report


def label_group_churn(changed: np.ndarray, groups: np.ndarray | None,
                      names: Sequence[str]) -> list[dict] | None:
    """Churn per group from the changed decisions (N, L): the single-label rows over the
    samples where any label changed, the pooled churn over the group's (sample, label) pairs
    and the GROUP_WORST_LABELS labels that changed most in it."""
    rows = group_churn(changed.any(axis=1), groups)
    if rows is None:
        return None
    codes = Slices.of(groups, changed.shape[0]).codes
    for code, row in enumerate(rows):
        counts = changed[codes == code].sum(axis=0)
        order = np.argsort(-counts, kind="stable")[:GROUP_WORST_LABELS]
        row["pooled_churn"] = int(counts.sum()) / counts.size / row["n"]
        row["most_changed_labels"] = [{"name": names[j], "changed": int(counts[j])}
                                      for j in order if counts[j]]
    return rows


def _label_free(report: dict) -> dict:
    """The entries of a multi-label report that need no labels; the others null."""
    return {**report, "quality": None, "flipped_indices": None, "fixed_indices": None,
            **{entry: (
                [{key: row[key] for key in keys} for row in report[entry]]
                if entry == "per_label" else {key: report[entry][key] for key in keys})
               for entry, keys in LABEL_FREE.items()}}


def _prefix(order: np.ndarray, labels: np.ndarray, old: np.ndarray,
            new: np.ndarray) -> LabelledPrefix:
    """The labelled prefix of the export order: a disagreement is a negative flip when a
    label the old version got right turned wrong, a positive flip when one turned right."""
    truth = labels[order]
    known = truth[:, 0] != UNLABELLED
    right_old, right_new = old[order] == truth, new[order] == truth
    return LabelledPrefix.of_flips(known, (right_old & ~right_new).any(axis=1) & known,
                                   (~right_old & right_new).any(axis=1) & known)
