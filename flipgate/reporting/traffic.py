"""The rows of a traffic report (flipgate.metrics.traffic) that the terminal and the HTML
report show: churn, the NFR bounds and estimate, the changed predictions, churn per group."""

from flipgate.reporting.rows import fmt_ci, fmt_int, fmt_num, fmt_pct

MAX_CHANGE_ROWS = 20  # cells of the old × new table shown (the largest first)
CHANGE_HEADER = ["Old class", "New class", "Samples"]
GROUP_CHURN_HEADER = ["Group", "n", "Changed", "Churn", "95% CI"]
LABEL_CHURN_HEADER = ["Label", "Changed", "Churn", "95% CI"]
LABEL_GROUP_CHURN_HEADER = [*GROUP_CHURN_HEADER, "Pooled churn", "Most changed labels"]


def traffic_rows(report: dict) -> list[tuple[str, str]]:
    """(metric, formatted value) pairs of a traffic report's headline (a multi-label one's
    per sample)."""
    r, labelled = report.get, report["disagreements"]
    if report.get("multilabel"):
        return _label_traffic_rows(report)
    confidence = r("confidence") or {}
    changed_gap = (confidence.get("changed_old_gap") or {}).get("mean")
    changed_new_gap = (confidence.get("changed_new_gap") or {}).get("mean")
    return [
        ("Samples (N)", fmt_int(r("n"))),
        ("Churn (changed predictions)", f"{fmt_pct(r('churn'))} ({fmt_int(r('changed'))}; "
                                        f"95% CI {fmt_ci(r('churn_ci'))})"),
        *_flip_rows(report, labelled, ""),
        ("ER new − ER old", fmt_pct(r("er_difference"))),
        (f"SChurn (α={fmt_num(r('schurn_alpha'), 2)})", fmt_num(r("schurn"), 4)),
        ("Confidence gap of changed, old → new",
         f"{fmt_num(changed_gap)} → {fmt_num(changed_new_gap)}"),
    ]


def _label_traffic_rows(report: dict) -> list[tuple[str, str]]:
    """A multi-label traffic report's headline: per sample, and churn pooled over labels."""
    pooled = report["pooled"]
    return [
        ("Samples (N) × labels (L)", f"{report['n']} × {report['num_labels']}"),
        ("Churn_sample (a label changed)", f"{fmt_pct(report['churn'])} ("
         f"{fmt_int(report['changed'])}; 95% CI {fmt_ci(report['churn_ci'])})"),
        ("Churn pooled over (sample, label)", f"{fmt_pct(pooled['churn'])} (95% CI "
         f"{fmt_ci(pooled['churn_ci'])})"),
        *_flip_rows(report, report["disagreements"], "_sample"),
        ("SChurn pooled (Bernoulli)", fmt_num(pooled["schurn"], 4)),
    ]


def _flip_rows(report: dict, labelled: dict, per: str) -> list[tuple[str, str]]:
    """The sure NFR bounds, the labelling progress, and NFR and PFR, exact or estimated
    (`per`: "_sample" for a multi-label report's per-sample rates)."""
    def rate(key: str) -> str:
        if labelled["complete"]:
            return fmt_pct(report[key])
        return (f"≈ {fmt_pct(labelled[f'{key}_estimate'])} "
                f"(95% CI {fmt_ci(labelled[f'{key}_interval'])})")

    return [(f"NFR{per} bounds (sure)", fmt_ci(report["nfr_bounds"])),
            ("Disagreements labelled", f"{labelled['labelled']} of {labelled['count']} "
                                       f"(prefix {labelled['labelled_prefix']})"),
            (f"NFR{per}", rate("nfr")), (f"PFR{per}", rate("pfr"))]


def change_section(report: dict) -> tuple[str, list[str], list[list[str]]]:
    """The title, header and rows of what changed: the largest cells of the old-class ×
    new-class table of changed predictions, or a multi-label report's churn per label (the
    most changed first)."""
    if report.get("multilabel"):
        labels = sorted(report["per_label"], key=lambda row: (-row["changed"], row["label"]))
        return "Churn per label, most changed first", LABEL_CHURN_HEADER, [
            [row["name"], str(row["changed"]), fmt_pct(row["churn"]), fmt_ci(row["churn_ci"])]
            for row in labels]
    return "Changed predictions (old → new)", CHANGE_HEADER, [
        [row["old_name"], row["new_name"], str(row["count"])]
        for row in report["changes"][:MAX_CHANGE_ROWS]]


def group_churn_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """The header and rows of churn per group (no rows without groups); a multi-label
    report's churn per sample, with the pooled churn and the labels that changed most."""
    rows = report.get("per_group_churn") or []
    cells = [[str(row["group"]), str(row["n"]), str(row["changed"]), fmt_pct(row["churn"]),
              fmt_ci(row["churn_ci"])] for row in rows]
    if not report.get("multilabel"):
        return GROUP_CHURN_HEADER, cells
    return LABEL_GROUP_CHURN_HEADER, [
        [*cell, fmt_pct(row["pooled_churn"]), ", ".join(
            f"{label['name']} ({label['changed']})" for label in row["most_changed_labels"])
         or "—"] for cell, row in zip(cells, rows, strict=True)]


def traffic_note(report: dict) -> str | None:
    """Why the keys that need labels are null (None once every sample is labelled)."""
    return report.get("labels_missing")
