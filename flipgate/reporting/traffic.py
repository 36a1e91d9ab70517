"""The rows of a traffic report (flipgate.metrics.traffic) that the terminal and the HTML
report show: churn, the NFR bounds and estimate, the changed predictions, churn per group."""

from flipgate.reporting.rows import fmt_ci, fmt_int, fmt_num, fmt_pct

MAX_CHANGE_ROWS = 20  # cells of the old × new table shown (the largest first)
CHANGE_HEADER = ["Old class", "New class", "Samples"]
GROUP_CHURN_HEADER = ["Group", "n", "Changed", "Churn", "95% CI"]


def traffic_rows(report: dict) -> list[tuple[str, str]]:
    """(metric, formatted value) pairs of a traffic report's headline."""
    r, labelled = report.get, report["disagreements"]
    confidence = r("confidence") or {}
    changed_gap = (confidence.get("changed_old_gap") or {}).get("mean")
    changed_new_gap = (confidence.get("changed_new_gap") or {}).get("mean")
    return [
        ("Samples (N)", fmt_int(r("n"))),
        ("Churn (changed predictions)", f"{fmt_pct(r('churn'))} ({fmt_int(r('changed'))}; "
                                        f"95% CI {fmt_ci(r('churn_ci'))})"),
        ("NFR bounds (sure)", fmt_ci(r("nfr_bounds"))),
        ("Disagreements labelled", f"{labelled['labelled']} of {labelled['count']} "
                                   f"(prefix {labelled['labelled_prefix']})"),
        ("NFR", fmt_pct(r("nfr")) if labelled["complete"] else
         f"≈ {fmt_pct(labelled['nfr_estimate'])} (95% CI {fmt_ci(labelled['nfr_interval'])})"),
        ("PFR", fmt_pct(r("pfr")) if labelled["complete"] else
         f"≈ {fmt_pct(labelled['pfr_estimate'])} (95% CI {fmt_ci(labelled['pfr_interval'])})"),
        ("ER new − ER old", fmt_pct(r("er_difference"))),
        (f"SChurn (α={fmt_num(r('schurn_alpha'), 2)})", fmt_num(r("schurn"), 4)),
        ("Confidence gap of changed, old → new",
         f"{fmt_num(changed_gap)} → {fmt_num(changed_new_gap)}"),
    ]


def change_rows(report: dict) -> list[list[str]]:
    """The largest cells of the old-class × new-class table of changed predictions."""
    return [[row["old_name"], row["new_name"], str(row["count"])]
            for row in report["changes"][:MAX_CHANGE_ROWS]]


def group_churn_rows(report: dict) -> list[list[str]]:
    """Churn per group (none without groups)."""
    return [[str(row["group"]), str(row["n"]), str(row["changed"]), fmt_pct(row["churn"]),
             fmt_ci(row["churn_ci"])] for row in report.get("per_group_churn") or []]


def traffic_note(report: dict) -> str | None:
    """Why the keys that need labels are null (None once every sample is labelled)."""
    return report.get("labels_missing")
