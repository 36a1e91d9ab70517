"""The text of a multi-label comparison's report that the terminal and the HTML page share:
the headline (per sample, pooled over (sample, label) pairs, quality of both versions), the
per-label table with the worst labels first, the per-group table, and the hints. Nothing
here draws (no rich).

Everything reads the JSON-ready dict of `flipgate.metrics.multilabel.compare_multilabel`."""

from flipgate.reporting.rows import (
    DASH,
    fmt_ci,
    fmt_int,
    fmt_num,
    fmt_p,
    fmt_pct,
    fmt_points,
    group_row,
)


def multilabel_headline_rows(report: dict) -> list[tuple[str, str]]:
    """(metric, formatted value) pairs: per sample, pooled, and both versions' quality."""
    sample, pooled = report["per_sample"], report["pooled"]
    old, new = report["quality"]["old"], report["quality"]["new"]
    return [
        ("Samples (N) × labels (L)", f"{report['n']} × {report['num_labels']}"),
        ("NFR_sample (a label turned wrong)",
         f"{fmt_pct(sample['nfr'])} (95% CI {fmt_ci(sample['nfr_ci'])})"),
        ("Exact-match flips (set right → not)",
         f"{fmt_pct(sample['exact_match_flips'])} "
         f"(95% CI {fmt_ci(sample['exact_match_flips_ci'])})"),
        ("Labels lost per sample (mean)", fmt_num(sample["mean_labels_lost"])),
        ("Churn_sample", fmt_pct(sample["churn"])),
        ("Pooled NFR (sample, label)", f"{fmt_pct(pooled['nfr'])} (bootstrap 95% CI "
                                       f"{fmt_ci(pooled['nfr_ci'])})"),
        ("Pooled churn", f"{fmt_pct(pooled['churn'])} (bootstrap 95% CI "
                         f"{fmt_ci(pooled['churn_ci'])})"),
        ("Lost positives / new false alarms",
         f"{pooled['lost_positives']} / {pooled['new_false_alarms']}"),
        ("Hamming loss old → new", _change(old["hamming_loss"], new["hamming_loss"])),
        ("Subset accuracy old → new", _change(old["subset_accuracy"], new["subset_accuracy"])),
        ("Micro-F1 old → new", _change(old["micro_f1"], new["micro_f1"])),
        ("Macro-F1 old → new", _change(old["macro_f1"], new["macro_f1"])),
        ("SChurn (pooled)", fmt_num(pooled["schurn"], 4)),
    ]


def _change(old: float | None, new: float | None) -> str:
    return f"{fmt_pct(old)} → {fmt_pct(new)} ({fmt_points(old, new)})"


LABEL_HEADER = ["Label", "support", "NFR", "NFR 95% CI", "lost +", "new false +", "PFR",
                "churn", "McNemar p", "F1 old", "F1 new"]


def label_severity(entry: dict) -> tuple[float, int]:
    """How badly a label regresses: its NFR, then its count of negative flips."""
    return (entry["nfr"], entry["negative_flips"])


def worst_labels_first(report: dict) -> list[dict]:
    """The per-label entries, the highest NFR first (ties: label order)."""
    return sorted(report["per_label"], key=label_severity, reverse=True)


def label_row(entry: dict) -> list[str]:
    """One per-label entry as formatted cells (see LABEL_HEADER)."""
    return [entry["name"], fmt_int(entry["support"]), fmt_pct(entry["nfr"]),
            fmt_ci(entry["nfr_ci"]), fmt_int(entry["lost_positives"]),
            fmt_int(entry["new_false_alarms"]), fmt_pct(entry["pfr"]), fmt_pct(entry["churn"]),
            fmt_p(entry["mcnemar_p"]), fmt_pct(entry["f1_old"]), fmt_pct(entry["f1_new"])]


TERMINAL_LABEL_HEADER = ["Label", "pos", "NFR", "lost+", "false+", "PFR", "churn", "F1 old",
                         "F1 new"]  # what fits 80 columns
TERMINAL_COLUMNS = [LABEL_HEADER.index(name) for name in (
    "Label", "support", "NFR", "lost +", "new false +", "PFR", "churn", "F1 old", "F1 new")]


def terminal_label_row(entry: dict) -> list[str]:
    """The cells of `label_row` that TERMINAL_LABEL_HEADER names."""
    return _picked(label_row(entry), TERMINAL_COLUMNS)


def _picked(cells: list[str], columns: list[int]) -> list[str]:
    return [cells[column] for column in columns]


MULTILABEL_GROUP_HEADER = ["Group", "n", "Hamming old", "Hamming new", "NFR_sample",
                           "NFR_sample 95% CI", "PFR_sample", "#neg", "#pos", "churn_sample",
                           "pooled NFR", "worst labels"]


def multilabel_group_row(entry: dict) -> list[str]:
    """One per-group entry as formatted cells (see MULTILABEL_GROUP_HEADER): the single-label
    group row (its error rates a group's Hamming loss, its flips samples with a label turned
    wrong or right), then churn_sample, the pooled NFR and the labels that lose the most."""
    worst = ", ".join(f"{label['name']} ({label['negative_flips']})"
                      for label in entry["worst_labels"])
    return [*group_row(entry), fmt_pct(entry["churn"]), fmt_pct(entry["pooled_nfr"]),
            worst or DASH]


TERMINAL_GROUP_HEADER = ["Group", "n", "NFR", "churn", "pooled", "HL old", "HL new",
                         "worst labels"]  # what fits 80 columns
TERMINAL_GROUP_COLUMNS = [MULTILABEL_GROUP_HEADER.index(name) for name in (
    "Group", "n", "NFR_sample", "churn_sample", "pooled NFR", "Hamming old", "Hamming new",
    "worst labels")]


def terminal_group_row(entry: dict) -> list[str]:
    """The cells of `multilabel_group_row` that TERMINAL_GROUP_HEADER names."""
    return _picked(multilabel_group_row(entry), TERMINAL_GROUP_COLUMNS)


def multilabel_hints(report: dict, *, old_name: str, new_name: str) -> list[str]:
    """Plain sentences about the comparison: how many samples lose a label, and the worst
    label."""
    sample = report["per_sample"]
    hints = [f"{new_name} gets at least one label wrong that {old_name} got right on "
             f"{sample['samples_with_negative_flips']} of {report['n']} samples (NFR_sample "
             f"{fmt_pct(sample['nfr'])})."]
    worst = worst_labels_first(report)[0]
    if worst["negative_flips"]:
        hints.append(f"Label {worst['name']} loses the most: NFR {fmt_pct(worst['nfr'])} "
                     f"({worst['lost_positives']} lost positives, {worst['new_false_alarms']} "
                     f"new false alarms; one-sided McNemar p = {fmt_p(worst['mcnemar_p'])}).")
    return hints
