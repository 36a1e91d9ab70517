"""The multi-label figures of docs/metrics.md §Multi-label pair metrics computed the plain way:
whole-array numpy, one label at a time, nothing shared with flipgate.metrics.multilabel."""

import numpy as np
from scipy.stats import norm

from flipgate.metrics.stats import wilson_interval


def bernoulli_scaled(p: np.ndarray) -> np.ndarray:
    """(1 − p, p) divided by its larger entry, per sample: (N, 2)."""
    q = np.stack([1.0 - p, p], axis=1)
    return q / q.max(axis=1, keepdims=True)


def f1(pred: np.ndarray, truth: np.ndarray) -> float | None:
    tp, fp, fn = np.sum(pred & truth), np.sum(pred & ~truth), np.sum(~pred & truth)
    return None if 2 * tp + fp + fn == 0 else float(2 * tp / (2 * tp + fp + fn))


def label_rows(y, old, new, old_p, new_p) -> list[dict]:
    rows = []
    for j in range(y.shape[1]):
        t, o, w = y[:, j], old[:, j], new[:, j]
        negative, positive = (o == t) & (w != t), (o != t) & (w == t)
        row = {"support": int(t.sum()), "negative_flips": int(negative.sum()),
               "lost_positives": int(np.sum(t & o & ~w)),
               "new_false_alarms": int(np.sum(~t & ~o & w)),
               "positive_flips": int(positive.sum()), "nfr": float(negative.mean()),
               "pfr": float(positive.mean()), "churn": float(np.mean(o != w)),
               "er_old": float(np.mean(o != t)), "er_new": float(np.mean(w != t)),
               "f1_old": f1(o, t), "f1_new": f1(w, t), "schurn": None,
               "prediction_difference": None}
        if old_p is not None:
            gap = np.abs(bernoulli_scaled(old_p[:, j]) - bernoulli_scaled(new_p[:, j]))
            row["schurn"] = float(0.5 * gap.sum(axis=1).mean())
            row["prediction_difference"] = float(np.abs(old_p[:, j] - new_p[:, j]).mean())
        rows.append(row)
    return rows


def quality(pred: np.ndarray, y: np.ndarray) -> dict:
    f1s = [f1(pred[:, j], y[:, j]) for j in range(y.shape[1])]
    defined = [value for value in f1s if value is not None]
    return {"hamming_loss": float(np.mean(pred != y)),
            "subset_accuracy": float(np.mean((pred == y).all(axis=1))),
            "micro_f1": f1(pred.ravel(), y.ravel()),
            "macro_f1": float(np.mean(defined)) if defined else None}


def reference(y, old, new, old_p=None, new_p=None) -> dict:
    """Every figure of the report but the intervals, from decisions `old`, `new` (N, L) and,
    where given, their probabilities."""
    y, old, new = (np.asarray(a).astype(bool) for a in (y, old, new))
    old_right, new_right = old == y, new == y
    negative, positive = old_right & ~new_right, ~old_right & new_right
    hit = negative.any(axis=1)
    return {
        "per_label": label_rows(y, old, new, old_p, new_p),
        "per_sample": {
            "nfr": float(hit.mean()), "pfr": float(positive.any(axis=1).mean()),
            "churn": float((old != new).any(axis=1).mean()),
            "exact_match_flips": float(np.mean(old_right.all(axis=1) & ~new_right.all(axis=1))),
            "exact_match_gains": float(np.mean(~old_right.all(axis=1) & new_right.all(axis=1))),
            "samples_with_negative_flips": int(hit.sum()),
            "mean_labels_lost": float(negative.sum(axis=1).mean()),
            "mean_labels_lost_when_hit": float(negative.sum(axis=1)[hit].mean())
            if hit.any() else None,
            "mean_lost_positives": float((negative & y).sum(axis=1).mean()),
        },
        "pooled": {
            "pairs": y.size, "negative_flips": int(negative.sum()),
            "positive_flips": int(positive.sum()), "changed": int(np.sum(old != new)),
            "lost_positives": int(np.sum(y & old & ~new)),
            "new_false_alarms": int(np.sum(~y & ~old & new)),
            "nfr": float(negative.mean()), "pfr": float(positive.mean()),
            "churn": float(np.mean(old != new)),
            "schurn": None if old_p is None else float(np.mean(
                [0.5 * np.abs(bernoulli_scaled(old_p[:, j]) - bernoulli_scaled(new_p[:, j]))
                 .sum(axis=1) for j in range(y.shape[1])])),
            "prediction_difference": None if old_p is None
            else float(np.abs(old_p - new_p).mean()),
        },
        "quality": {"old": quality(old, y), "new": quality(new, y)},
        "flipped_indices": [np.flatnonzero(negative[:, j]).tolist() for j in range(y.shape[1])],
        "fixed_indices": [np.flatnonzero(positive[:, j]).tolist() for j in range(y.shape[1])],
    }


def label_cost(y, old, new, costs, gains) -> dict:
    """The expected cost per sample under per-label weights, its normal 95% interval with
    the samples as clusters, the one-sided p of H0 "mean <= 0", and each label's share, from
    the per-sample costs of decisions `old`, `new` (N, L)."""
    y, old, new = (np.asarray(a).astype(bool) for a in (y, old, new))
    negative, positive = (old == y) & (new != y), (old != y) & (new == y)
    costs, gains = np.asarray(costs, dtype=float), np.asarray(gains, dtype=float)
    per_sample = negative @ costs - positive @ gains
    mean, error = per_sample.mean(), per_sample.std(ddof=1) / np.sqrt(len(per_sample))
    half = norm.ppf(0.975) * error
    return {"expected_cost": float(mean), "expected_cost_ci": [mean - half, mean + half],
            "cost_p": float(norm.sf(mean / error)),
            "per_label": (negative.sum(axis=0) * costs - positive.sum(axis=0) * gains)
            / len(per_sample)}


def close(actual: object, expected: object) -> bool:
    """Equal, floats to 1e-9 relative; None only where None is expected."""
    import pytest

    return actual is None if expected is None else \
        actual == pytest.approx(expected, rel=1e-9, abs=1e-12)


def assert_matches(report: dict, expected: dict) -> None:
    """The report's figures equal the reference's."""
    for section in ("per_sample", "pooled"):
        for key, value in expected[section].items():
            assert close(report[section][key], value), (section, key)
    for model in ("old", "new"):
        for key, value in expected["quality"][model].items():
            assert close(report["quality"][model][key], value), (model, key)
    for row, want in zip(report["per_label"], expected["per_label"], strict=True):
        for key, value in want.items():
            assert close(row[key], value), (row["name"], key)
    for key in ("flipped_indices", "fixed_indices"):
        assert list(report[key].values()) == expected[key], key


def group_reference(y, old, new, groups) -> list[dict]:
    """The per-group rows of decisions `old`, `new` (N, L): one boolean mask per group, in
    the groups' sorted order; every figure but the intervals and the worst labels."""
    y, old, new = (np.asarray(a).astype(bool) for a in (y, old, new))
    groups = np.asarray(groups)
    rows = []
    for group in sorted(set(groups.tolist())):
        member = groups == group
        t, o, w = y[member], old[member], new[member]
        negative, positive = (o == t) & (w != t), (o != t) & (w == t)
        rows.append({"group": group, "n": int(member.sum()),
                     "nfr": float(negative.any(axis=1).mean()),
                     "pfr": float(positive.any(axis=1).mean()),
                     "churn": float((o != w).any(axis=1).mean()),
                     "negative_flips": int(negative.any(axis=1).sum()),
                     "positive_flips": int(positive.any(axis=1).sum()),
                     "pooled_nfr": float(negative.mean()),
                     "er_old": float(np.mean(o != t)), "er_new": float(np.mean(w != t)),
                     "label_flips": negative.sum(axis=0).tolist()})
    return rows


def assert_groups_match(report: dict, expected: list[dict]) -> None:
    """The report's per-group rows equal the reference's, each NFR_sample with its Wilson
    interval, and each group's worst labels are those with the most negative flips."""
    assert [row["group"] for row in report["per_group"]] == [row["group"] for row in expected]
    names = report["label_names"]
    for row, want in zip(report["per_group"], expected, strict=True):
        flips = want["label_flips"]
        for key, value in want.items():
            if key not in ("group", "label_flips"):
                assert close(row[key], value), (row["group"], key)
        assert row["nfr_ci"] == list(wilson_interval(want["negative_flips"], want["n"]))
        worst = sorted((j for j in range(len(flips)) if flips[j]), key=lambda j: -flips[j])
        assert [(entry["name"], entry["negative_flips"]) for entry in row["worst_labels"]] == \
            [(names[j], flips[j]) for j in worst[:len(row["worst_labels"])]]
        assert len(row["worst_labels"]) == min(3, len(worst))


def group_churn_reference(old, new, groups, names: list[str]) -> list[dict]:
    """Churn per group of decisions `old`, `new` (N, L), one boolean mask per group in the
    groups' sorted order: churn_sample with its Wilson interval, the pooled churn, and the
    (at most 3) labels with the most changed decisions, ties by label order."""
    changed = np.asarray(old).astype(bool) != np.asarray(new).astype(bool)
    groups = np.asarray(groups)
    rows = []
    for group in sorted(set(groups.tolist())):
        member = changed[groups == group]
        moved, counts = int(member.any(axis=1).sum()), member.sum(axis=0).tolist()
        most = sorted((j for j in range(len(counts)) if counts[j]),
                      key=lambda j: (-counts[j], j))[:3]
        rows.append({"group": group, "n": len(member), "changed": moved,
                     "churn": moved / len(member),
                     "churn_ci": list(wilson_interval(moved, len(member))),
                     "pooled_churn": float(member.mean()),
                     "most_changed_labels": [{"name": names[j], "changed": counts[j]}
                                             for j in most]})
    return rows


def assert_group_churn_matches(report: dict, expected: list[dict]) -> None:
    """The report's churn per group equals the reference's, row for row."""
    assert [row["group"] for row in report["per_group_churn"]] == \
        [row["group"] for row in expected]
    for row, want in zip(report["per_group_churn"], expected, strict=True):
        for key, value in want.items():
            assert close(row[key], value) if isinstance(value, float) else row[key] == value, \
                (row["group"], key)
