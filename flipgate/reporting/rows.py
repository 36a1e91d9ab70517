"""The text of a report of one old/new comparison that the terminal and the HTML report
share: formatted numbers, table rows and the verdict hints. Nothing here draws (no rich).
The numbers are written so everywhere: the server's gate reasons and its dashboard
(service/ui/numbers.py) call the same functions.

Everything reads the JSON-ready dict of `PairAnalysis.to_dict()`; undefined values (None)
are shown as "—". The hints only describe the numbers; they decide nothing.
"""

import math

DASH = "—"
SIGNIFICANCE = 0.05


def fmt_pct(value: float | None, beside: float | None = None) -> str:
    """0.0123 -> '1.23%'; None -> '—'. Next to a limit (`beside`, a rate), with as many more
    decimals (up to six) as it takes not to read as the limit: 0.03004 beside 0.03 ->
    '3.004%', not '3.00%'."""
    if value is None:
        return DASH
    digits = 2
    while (beside is not None and digits < 6
           and math.isclose(round(100 * value, digits), 100 * beside)):
        digits += 1
    return f"{100 * value:.{digits}f}%"


def fmt_limit(value: float) -> str:
    """A limit that a person set on a rate, as a percentage with the digits it has (no fewer,
    no trailing zeros): 0.03 -> '3%', 0.0125 -> '1.25%'."""
    return f"{fmt_exact(100 * value)}%"


def fmt_exact(value: float) -> str:
    """A number that a person set, with the digits it has: 2.0 -> '2', 0.0125 -> '0.0125'."""
    return f"{value:.10f}".rstrip("0").rstrip(".")


def fmt_num(value: float | None, digits: int = 3) -> str:
    """A plain number with `digits` decimals; None -> '—'."""
    return DASH if value is None else f"{value:.{digits}f}"


def fmt_int(value: int | None) -> str:
    """A count; None -> '—'."""
    return DASH if value is None else str(value)


def fmt_p(value: float | None) -> str:
    """A p-value: four decimals, scientific below 1e-4; None -> '—'."""
    if value is None:
        return DASH
    return f"{value:.2e}" if 0 < value < 1e-4 else f"{value:.4f}"


def fmt_points(old: float | None, new: float | None) -> str:
    """The change from `old` to `new` in percentage points: 0.1, 0.12 -> '+2.00 pts'."""
    return DASH if old is None or new is None else f"{100 * (new - old):+.2f} pts"


def fmt_ci(interval: list[float] | None) -> str:
    """An interval of rates: [0.01, 0.02] -> '1.00% – 2.00%'; None or empty -> '—'."""
    return DASH if not interval else f"{fmt_pct(interval[0])} – {fmt_pct(interval[1])}"


def _samples(count: int) -> str:
    return f"{count} sample" if count == 1 else f"{count} samples"


def class_label(index: int, class_names: list[str] | None) -> str:
    """The name of class `index`, or its number when no (or too few) names are given."""
    return class_names[index] if class_names and index < len(class_names) else str(index)


def headline_rows(report: dict) -> list[tuple[str, str]]:
    """(metric, formatted value) pairs of the headline numbers."""
    r = report.get
    churn = (f"{fmt_pct(r('churn'))} (old-correct {fmt_pct(r('churn_old_correct'))}, "
             f"old-incorrect {fmt_pct(r('churn_old_incorrect'))})")
    return [
        ("Samples (N)", fmt_int(r("n"))),
        ("Error rate old → new", f"{fmt_pct(r('er_old'))} → {fmt_pct(r('er_new'))} "
                                 f"({fmt_points(r('er_old'), r('er_new'))})"),
        ("NFR (negative flip rate)", f"{fmt_pct(r('nfr'))} (95% CI {fmt_ci(r('nfr_ci'))})"),
        ("PFR (positive flip rate)", fmt_pct(r("pfr"))),
        ("Rel-NFR", fmt_num(r("rel_nfr"))),
        ("NFI (neg. flips / new errors)", fmt_pct(r("nfi"))),
        ("BTC (both right / old right)", fmt_pct(r("btc"))),
        ("BEC (both wrong / new wrong)", fmt_pct(r("bec"))),
        ("Churn", churn),
        (f"SChurn (α={fmt_num(r('schurn_alpha'), 2)})", fmt_num(r("schurn"), 4)),
        ("Negative flips", fmt_int(r("negative_flips"))),
        ("Positive flips", fmt_int(r("positive_flips"))),
        ("Both wrong", fmt_int(r("both_wrong"))),
        ("McNemar p (one-sided)", fmt_p(r("mcnemar_p"))),
    ]


CLASS_HEADER = ["Class", "n", "ER old", "ER new", "NFR", "PFR", "#neg", "#pos"]


def class_row(entry: dict, class_names: list[str] | None) -> list[str]:
    """One per-class entry of the report as formatted cells (see CLASS_HEADER)."""
    return [
        class_label(entry["class"], class_names),
        fmt_int(entry.get("n")),
        fmt_pct(entry.get("er_old")),
        fmt_pct(entry.get("er_new")),
        fmt_pct(entry.get("nfr")),
        fmt_pct(entry.get("pfr")),
        fmt_int(entry.get("negative_flips")),
        fmt_int(entry.get("positive_flips")),
    ]


GROUP_HEADER = ["Group", "n", "ER old", "ER new", "NFR", "NFR 95% CI", "PFR", "#neg", "#pos"]


def group_row(entry: dict) -> list[str]:
    """One per-group entry of the report as formatted cells (see GROUP_HEADER)."""
    cells = class_row({**entry, "class": entry["group"]}, None)
    return [str(entry["group"]), *cells[1:5], fmt_ci(entry.get("nfr_ci")), *cells[5:]]


def flip_severity(entry: dict) -> tuple[float, int]:
    """How badly a per-class entry regresses: its NFR, then its count of negative flips."""
    return (entry.get("nfr") or 0.0, entry.get("negative_flips") or 0)


def worst_class(report: dict) -> dict | None:
    """The per-class entry with the highest NFR (ties: more negative flips), if any flips."""
    flipped = [e for e in report.get("per_class") or [] if e.get("negative_flips")]
    return max(flipped, key=flip_severity, default=None)


def _flip_hint(report: dict, old_name: str, new_name: str) -> str:
    neg, pos = report.get("negative_flips") or 0, report.get("positive_flips") or 0
    both = report.get("both_wrong") or 0
    stays = "stays" if both == 1 else "stay"
    return (f"{new_name} fixes {_samples(pos)} that {old_name} got wrong and breaks "
            f"{_samples(neg)} that it got right; {_samples(both)} {stays} wrong under both.")


def _significance_hint(report: dict, new_name: str) -> str:
    p = report.get("mcnemar_p")
    if not (report.get("negative_flips") or report.get("positive_flips")):
        return "No sample moves between right and wrong, so McNemar's test has nothing to weigh."
    if p is not None and p < SIGNIFICANCE:
        return (f"{new_name} makes significantly more new errors than it fixes at the 5% level "
                f"(one-sided McNemar p = {fmt_p(p)}).")
    return (f"{new_name} does not make significantly more new errors than it fixes at the 5% "
            f"level (one-sided McNemar p = {fmt_p(p)}).")


def _nfr_bound_hint(report: dict) -> str | None:
    interval = report.get("nfr_ci")
    if not interval:
        return None
    return (f"The true NFR may be as high as {fmt_pct(interval[1])} (upper end of the Wilson "
            f"95% interval; observed {fmt_pct(report.get('nfr'))} on "
            f"{_samples(report.get('n') or 0)}).")


def _worst_class_hint(report: dict, class_names: list[str] | None) -> str | None:
    worst = worst_class(report)
    if worst is None:
        return None
    return (f"Class {class_label(worst['class'], class_names)} loses the most: NFR "
            f"{fmt_pct(worst.get('nfr'))} ({worst.get('negative_flips')} of "
            f"{_samples(worst.get('n') or 0)} flipped from right to wrong).")


def _accuracy_hint(report: dict, old_name: str) -> str | None:
    er_old, er_new = report.get("er_old"), report.get("er_new")
    if er_old is None or er_new is None:
        return None
    neg = report.get("negative_flips") or 0
    change = f"error {fmt_pct(er_old)} → {fmt_pct(er_new)}"
    if er_new < er_old and neg:
        return (f"Accuracy improves ({change}) but {_samples(neg)} that {old_name} got right "
                f"are now wrong; users who relied on them will see a regression.")
    if er_new < er_old:
        return f"Accuracy improves ({change}) without a single negative flip."
    if er_new > er_old:
        return f"Accuracy gets worse ({change})."
    return f"Accuracy is unchanged ({change})."


def verdict_hints(
    report: dict, *, old_name: str, new_name: str, class_names: list[str] | None = None
) -> list[str]:
    """Short plain sentences about the comparison that a user can act on."""
    hints = [
        _flip_hint(report, old_name, new_name),
        _significance_hint(report, new_name),
        _nfr_bound_hint(report),
        _worst_class_hint(report, class_names),
        _accuracy_hint(report, old_name),
    ]
    return [hint for hint in hints if hint]
