"""The gate on a traffic set (docs/traffic.md): churn is checked at once; NFR by its
interval from the labelled disagreements (pass when its upper end is within the limit,
block when its lower end is above it, else pending until more labels arrive); the error-rate
increase once every disagreement is labelled; limits that need labels the traffic cannot
give are reported as not applicable."""

from typing import Any

from flipgate.metrics.traffic import LabelledPrefix
from flipgate.reporting.rows import fmt_ci, fmt_limit, fmt_pct
from service.compare.models import PairMetrics
from service.gate.verdicts import note

DECIDED_ON_TRAFFIC = ("max_nfr", "max_churn", "max_er_increase")
NOT_LIMITS = ("evalsets", "negative_flip_cost", "positive_flip_gain", "significance_test",
              "min_group_size")


TRAFFIC_REPORT_KEYS = ("disagreements", "nfr_ci", "changed", "label_revision",
                       "er_difference")  # what traffic_metrics reads of a report


def traffic_metrics(row: PairMetrics, report: dict[str, Any]) -> dict[str, Any]:
    """The numbers a policy is checked against on a traffic set, from its stored pair's
    columns and the TRAFFIC_REPORT_KEYS of its report."""
    labelled = report["disagreements"]
    interval = report["nfr_ci"] if labelled["complete"] else labelled["nfr_interval"]
    return {"traffic": True, "n": row.n, "churn": row.churn, "changed": report["changed"],
            "label_revision": report.get("label_revision") or 0, "nfr": row.nfr,
            "nfr_estimate": labelled["nfr_estimate"], "nfr_interval": interval,
            "er_increase": report["er_difference"], "disagreements": labelled["count"],
            "labelled": labelled["labelled"], "labelled_prefix": labelled["labelled_prefix"],
            "unlabelled": labelled["count"] - labelled["labelled"],
            "prefix": {key: labelled[key] for key in (
                "count", "labelled", "labelled_prefix", "negative_flips_in_prefix",
                "positive_flips_in_prefix", "negative_flips_known", "positive_flips_known")}}


def check_traffic(policy, evalset: str, metrics: dict[str, Any], reason) -> list[dict]:
    """The reasons of a traffic set: blocking ones (churn, NFR's interval above the limit,
    the error-rate increase), `pending` ones (labels_needed: the interval straddles the
    limit, or the error-rate increase is not known yet) and notes for limits that do not
    apply. `reason(code, evalset, measured, limit)` makes a blocking limit's reason."""
    reasons = []
    if policy.max_churn is not None and metrics["churn"] > policy.max_churn:
        reasons.append(reason("max_churn", evalset, metrics["churn"], policy.max_churn))
    if policy.max_nfr is not None:
        reasons += _nfr_reasons(policy.max_nfr, evalset, metrics, reason)
    if policy.max_er_increase is not None:
        reasons += _er_reasons(policy.max_er_increase, evalset, metrics, reason)
    inapplicable = [name for name, value in policy if value is not None and name not in
                    (*DECIDED_ON_TRAFFIC, *NOT_LIMITS) and value != []]
    if inapplicable:
        reasons.append({**note("not_applicable_on_traffic", f"on {evalset} (traffic, "
                               f"unlabelled): {', '.join(inapplicable)} need labels of every "
                               "sample and are not checked"), "evalset": evalset})
    return reasons


def _nfr_reasons(limit: float, evalset: str, metrics: dict[str, Any], reason) -> list[dict]:
    """Block when NFR's interval lies above the limit; pending while it straddles it."""
    low, high = metrics["nfr_interval"]
    if high <= limit:
        return []
    if low > limit:
        found = reason("max_nfr", evalset, low, limit)
        return [{**found, "message": f"on {evalset}: NFR is at least "
                 f"{fmt_pct(low, beside=limit)} (95% interval {fmt_ci([low, high])}), above "
                 f"the maximum {fmt_limit(limit)}"}]
    prefix = LabelledPrefix.from_report(metrics["prefix"])
    more = prefix.labels_to_decide(limit * metrics["n"])
    return [labels_needed(evalset, metrics, more, f"NFR lies between {fmt_pct(low)} and "
                          f"{fmt_pct(high)}, around the maximum {fmt_limit(limit)}")]


def _er_reasons(limit: float, evalset: str, metrics: dict[str, Any], reason) -> list[dict]:
    """The error-rate increase (NFR − PFR) is known once every disagreement is labelled."""
    increase = metrics["er_increase"]
    if increase is None:
        return [labels_needed(evalset, metrics, metrics["unlabelled"],
                              "the error-rate increase is known once every disagreement is "
                              "labelled")]
    return [reason("max_er_increase", evalset, increase, limit)] if increase > limit else []


def labels_needed(evalset: str, metrics: dict[str, Any], more: int, why: str) -> dict:
    """A pending reason: how many disagreements are unlabelled, and how many more labels
    (in the export order) would decide if the share seen so far held."""
    return {**note("labels_needed", f"on {evalset}: {why}; {metrics['unlabelled']} of "
                   f"{metrics['disagreements']} disagreements are unlabelled (about {more} "
                   "more labels, in the export's order, would decide)"),
            "evalset": evalset, "pending": True, "labels_needed": metrics["unlabelled"],
            "labels_to_decide": more}
