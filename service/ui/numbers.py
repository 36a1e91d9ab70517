"""How the dashboard writes a number, the same on every page: a rate (NFR, error, churn) as a
percentage, with its 95% interval where it has one, as the pair report, the `flipgate`
command and the gate's reasons write them (flipgate.reporting.rows: `1.23%`, `1.00% –
2.00%`); a policy's limit as it is set (`3%`); a count as an integer; a p-value to three
significant digits; a policy's rules named as the gate's reasons name them. Templates use it
through macros.html's `rate` and `metric`, the SVGs (heatmap, history, repair curve)
directly."""

from typing import Any

from flipgate.reporting.rows import fmt_ci, fmt_exact, fmt_pct
from service.gate.rules import GROUP_LIMITS, LABEL_LIMITS, LIMITS, SAMPLE_LIMITS, Limit, Policy

RATES = frozenset({"nfr", "pfr", "er_old", "er_new", "er", "churn", "er_increase",
                   "er_decrease", "nfr_upper", "worst_class_nfr", "nfr_mc", "history_nfr",
                   "nfr_estimate", "max_nfr", "max_churn", "max_nfr_upper", "max_class_nfr",
                   "max_er_increase", "min_er_decrease", "max_nfr_mc", "max_group_nfr",
                   "max_group_er_increase", "max_nfr_vs_history", "lost_positive_rate",
                   "max_label_nfr", "max_lost_positives"})
COUNTS = frozenset({"n", "negative_flips", "positive_flips", "disagreements", "labelled",
                    "unlabelled", "support", "lost_positives", "new_false_alarms"})
P_VALUES = frozenset({"mcnemar_p", "cost_p", "significance"})
LABELS = {"nfr": "NFR", "pfr": "PFR", "er_old": "Error before", "er_new": "Error after",
          "churn": "Churn", "negative_flips": "Negative flips",
          "positive_flips": "Positive flips", "mcnemar_p": "McNemar p"}


def percent(value: float, digits: int = 2) -> str:
    """A rate as a percentage: 0.0123 -> '1.23%' (fewer `digits` where space is short)."""
    return fmt_pct(value) if digits == 2 else f"{100 * value:.{digits}f}%"


def percent_tick(value: float) -> str:
    """A rate's mark on a plot's axis, to three significant digits: 0.0125 -> '1.25%'."""
    return f"{100 * value:.3g}%"


def percent_interval(bounds: Any) -> str:
    """A rate's interval: [0.01, 0.02] -> '1.00% – 2.00%'."""
    return fmt_ci(list(bounds))


def kind(key: str) -> str:
    """How the number named `key` (a metric, or a policy limit's name) is written: "rate",
    "count", "p" or "number"."""
    for name, keys in (("rate", RATES), ("count", COUNTS), ("p", P_VALUES)):
        if key in keys:
            return name
    return "number"


def _spec(code: str) -> Limit | None:
    return LIMITS.get(code) or GROUP_LIMITS.get(code) or LABEL_LIMITS.get(code)


def limit_metric(code: str) -> str:
    """The metric a reason's code bounds (max_class_nfr -> worst_class_nfr, a label's
    max_lost_positives -> lost_positive_rate), else the code."""
    spec = _spec(code)
    return spec.metric if spec is not None else code


def limit(code: str, value: float) -> str:
    """A policy's bound as it was set and as the gate's reasons write it: a rate's as a
    percentage with the digits it has (max_nfr 0.03 -> '3%'); a significance level (a
    reason's Bonferroni share of it) to three significant digits."""
    spec = _spec(code)
    return spec.written(value) if spec is not None else f"{value:.3g}"


SETTINGS = {"significance": "significance level", "significance_test": "significance test",
            "min_group_size": "smallest gated group", "negative_flip_cost":
            "cost of a negative flip", "positive_flip_gain": "gain of a positive flip",
            "evalsets": "eval sets"}
WHOSE = {**dict.fromkeys(GROUP_LIMITS, " of each group"),
         **dict.fromkeys(LABEL_LIMITS, " of each label")}  # the limits on every group (label)


def policy_rules(rules: dict[str, Any], *, multilabel: bool = False) -> list[tuple[str, str]]:
    """A policy's rules for people, as (name, value) in the order of Policy's fields: each
    limit named as the gate's reasons name it, with its bound ('NFR', 'at most 3%'; 'NFR of
    a label', 'label cat: at most 1%'), the other settings by their names; unset ones left
    out."""
    named = {**LIMITS, **(SAMPLE_LIMITS if multilabel else {})}
    return [_rule(key, rules[key], named) for key in dict.fromkeys([*Policy.model_fields, *rules])
            if rules.get(key) not in (None, [])]


def _rule(key: str, value: Any, named: dict[str, Limit]) -> tuple[str, str]:
    """One rule's (name, value); a per-label map gives each label's bound."""
    spec = named.get(key) or GROUP_LIMITS.get(key) or LABEL_LIMITS.get(key)
    if spec is None:
        shown = (", ".join(map(str, value)) if isinstance(value, list)
                 else fmt_exact(value) if isinstance(value, float) else str(value))
        return SETTINGS.get(key, key), shown
    if key == "max_nfr_vs_history":
        return (spec.label.replace("earlier", f"the last {value['versions']}"),
                _bound(spec, value["max"]))
    if isinstance(value, dict):
        return f"{spec.label} of a label", ", ".join(
            f"label {name}: {_bound(spec, bound)}" for name, bound in value.items())
    return f"{spec.label}{WHOSE.get(key, '')}", _bound(spec, value)


def _bound(spec: Limit, value: float) -> str:
    return f"{'at most' if spec.upper else 'at least'} {spec.written(value)}"


def label(key: str) -> str:
    """A metric's name for a table's header (not its API key)."""
    return LABELS.get(key, key.replace("_", " "))
