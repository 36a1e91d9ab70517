"""A gate policy's limits and how a candidate's measured metrics are checked against them."""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flipgate.metrics.cost import label_update_cost, update_cost
from flipgate.reporting.rows import class_label, fmt_ci, fmt_exact, fmt_limit, fmt_pct
from service.compare.models import PairMetrics
from service.gate.models import Verdict
from service.gate.traffic import check_traffic
from service.names import NAME

# Limits are JSON numbers (strict: "0.1", true and false are refused), finite and bounded.
Rate = Annotated[float, Field(ge=0.0, le=1.0, strict=True, allow_inf_nan=False)]
RateChange = Annotated[float, Field(ge=-1.0, le=1.0, strict=True, allow_inf_nan=False)]
RelativeRate = Annotated[float, Field(ge=0.0, le=1e6, strict=True, allow_inf_nan=False)]
Probability = Annotated[float, Field(gt=0.0, lt=1.0, strict=True, allow_inf_nan=False)]
Weight = Annotated[float, Field(ge=0.0, le=1e6, strict=True, allow_inf_nan=False)]
CostPerSample = Annotated[float, Field(ge=-1e6, le=1e6, strict=True, allow_inf_nan=False)]
EvalsetName = Annotated[str, Field(pattern=f"^{NAME.pattern}$")]
LabelName = Annotated[str, Field(min_length=1, max_length=256)]
LabelRates = Rate | Annotated[dict[LabelName, Rate], Field(min_length=1, max_length=1 << 16)]
LabelWeights = Weight | Annotated[dict[LabelName, Weight], Field(min_length=1,
                                                                max_length=1 << 16)]
MAX_POLICY_EVALSETS = 50
MAX_HISTORY_VERSIONS = 100


class HistoryLimit(BaseModel):
    """At most `max` (a share of the eval set) broken among the samples that any of the last
    `versions` production versions got right."""

    model_config = ConfigDict(extra="forbid")

    versions: Annotated[int, Field(ge=1, le=MAX_HISTORY_VERSIONS, strict=True)]
    max: Rate


class Policy(BaseModel):
    """The limits a candidate must stay within on every eval set; unset limits are not checked.

    `significance` waives the limits on negative flips (NFR, its upper bound, relative NFR and
    the worst class's NFR) unless the one-sided McNemar test finds the candidate makes more new
    errors than it fixes at this level; with no such limit set, the test alone blocks.
    """

    model_config = ConfigDict(extra="forbid")

    max_nfr: Rate | None = None
    max_nfr_upper: Rate | None = Field(None, description="upper end of NFR's Wilson 95% interval")
    max_rel_nfr: RelativeRate | None = Field(None, description="NFR / ((1 - ER_old) * ER_new)")
    max_churn: Rate | None = None
    max_er_increase: RateChange | None = None
    max_class_nfr: Rate | None = Field(None, description="the NFR of the worst true class")
    min_er_decrease: RateChange | None = Field(None, description="ER_old - ER_new at least")
    significance: Probability | None = Field(None, description="McNemar level (see above)")
    significance_test: Literal["flips", "cost"] | None = Field(
        None, description="cost: H0 is 'the update does not raise the expected cost'")
    max_nfr_mc: Rate | None = Field(None, description="new wrong and changed (MUSCLE)")
    max_group_nfr: Rate | None = Field(None, description="the NFR of every gated group")
    max_group_er_increase: RateChange | None = None
    min_group_size: Annotated[int, Field(ge=1, le=10**9, strict=True)] | None = Field(
        None, description="smaller groups are reported, not gated")
    negative_flip_cost: LabelWeights | None = Field(
        None, description="default 1; multi-label: one weight, or a weight per label name")
    positive_flip_gain: LabelWeights | None = Field(
        None, description="default 1; multi-label: one weight, or a weight per label name")
    max_expected_cost: CostPerSample | None = Field(
        None, description="(cost·NF − gain·PF) / N")
    max_nfr_vs_history: HistoryLimit | None = None
    max_label_nfr: LabelRates | None = Field(
        None, description="multi-label: each label's NFR (one limit, or a limit per label name)")
    max_lost_positives: LabelRates | None = Field(
        None, description="multi-label: each label's lost positives (y = 1, old 1, new 0) as a "
                          "share of the samples (one limit, or a limit per label name)")
    evalsets: list[EvalsetName] = Field(default_factory=list, max_length=MAX_POLICY_EVALSETS,
                                        description="eval sets every gate uses")

    @field_validator("evalsets")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        return list(dict.fromkeys(names))

    @field_validator("negative_flip_cost")
    @classmethod
    def _positive_cost(cls, cost: float | dict[str, float] | None
                       ) -> float | dict[str, float] | None:
        if 0 in (cost.values() if isinstance(cost, dict) else (cost,)):
            raise ValueError("a negative flip must cost more than 0")
        return cost

    @property
    def costs(self) -> tuple[float, float]:
        """The cost of a negative flip and the gain of a positive one (default 1 and 1) of a
        single-label line (which refuses maps of labels)."""
        return _weight(self.negative_flip_cost, None), _weight(self.positive_flip_gain, None)

    def label_weights(self, names: list[str]) -> tuple[list[float], list[float]]:
        """Per label (by name), what its negative flips cost and its positive ones earn:
        the policy's one weight, or the label's entry of its map, else 1."""
        return ([_weight(self.negative_flip_cost, name) for name in names],
                [_weight(self.positive_flip_gain, name) for name in names])

    def limits_set(self) -> list[str]:
        """The names of the limits this policy sets (eval sets aside)."""
        return [name for name, value in self if value is not None and name != "evalsets"]

    def named_labels(self) -> dict[str, list[str]]:
        """The label names each per-label map of this policy names, by limit."""
        return {name: list(limits) for name in LABEL_MAPS
                if isinstance(limits := getattr(self, name), dict)}

    def inapplicable(self, *, multilabel: bool) -> list[str]:
        """The limits it sets that a line of this kind cannot be checked against: those of
        multi-label lines (and weights per label) on a single-label one, and the others on
        a multi-label one."""
        per_label = [] if multilabel else [f"{name} (a map of labels)" for name in LABEL_WEIGHTS
                                           if isinstance(getattr(self, name), dict)]
        return [name for name in self.limits_set()
                if (name in MULTILABEL_ONLY) != multilabel
                and not (multilabel and name in MULTILABEL_TOO)] + per_label

    @property
    def weighs_costs(self) -> bool:
        """Whether the decision measures the expected cost."""
        return (self.max_expected_cost is not None or self.significance_test == "cost"
                or self.negative_flip_cost is not None or self.positive_flip_gain is not None)


DEFAULT_POLICY = Policy(significance=0.05)
MULTILABEL_ONLY = ("max_label_nfr", "max_lost_positives")
MULTILABEL_TOO = ("max_nfr", "max_nfr_upper", "max_churn", "significance", "significance_test",
                  "negative_flip_cost", "positive_flip_gain", "max_expected_cost",
                  "max_group_nfr", "max_group_er_increase", "min_group_size")  # either kind
LABEL_WEIGHTS = ("negative_flip_cost", "positive_flip_gain")  # a map of labels: multi-label
LABEL_MAPS = (*MULTILABEL_ONLY, *LABEL_WEIGHTS)  # the fields that may name labels


def _weight(weight: float | dict[str, float] | None, label: str | None) -> float:
    """A cost or gain of `label`: the one weight, the label's entry of a map, else 1."""
    if isinstance(weight, dict):
        return weight.get(label, 1.0)
    return 1.0 if weight is None else weight


@dataclass(frozen=True)
class Limit:
    """A policy field: the metric it bounds, from above or below, what it is called, and
    whether that metric is a rate (written as a percentage)."""

    metric: str
    upper: bool
    on_flips: bool
    label: str
    rate: bool = True

    def violated(self, value: float, bound: float) -> bool:
        return value > bound if self.upper else value < bound

    def figures(self, measured: float, bound: float,
                interval: list[float] | None = None) -> tuple[str, str]:
        """The measured value and the bound as a reason writes them: a rate as a percentage
        (with its 95% interval where it has one) as the pair report and the dashboard write
        it, its bound as the policy sets it (3%); another number to four significant
        digits."""
        if not self.rate:
            return f"{measured:.4g}", self.written(bound)
        shown = fmt_pct(measured, beside=bound)
        if interval and None not in interval:
            shown += f" (95% interval {fmt_ci(interval)})"
        return shown, self.written(bound)

    def written(self, bound: float) -> str:
        """The bound as the policy sets it: a rate's as a percentage (0.03 -> '3%')."""
        return fmt_limit(bound) if self.rate else fmt_exact(bound)


LIMITS = {
    "max_nfr": Limit("nfr", upper=True, on_flips=True, label="NFR"),
    "max_nfr_upper": Limit("nfr_upper", upper=True, on_flips=True,
                           label="the upper end of NFR's 95% interval"),
    "max_rel_nfr": Limit("rel_nfr", upper=True, on_flips=True, label="relative NFR",
                         rate=False),
    "max_churn": Limit("churn", upper=True, on_flips=False, label="churn"),
    "max_er_increase": Limit("er_increase", upper=True, on_flips=False,
                             label="the error-rate increase"),
    "max_class_nfr": Limit("worst_class_nfr", upper=True, on_flips=True,
                           label="the worst class's NFR"),
    "min_er_decrease": Limit("er_decrease", upper=False, on_flips=False,
                             label="the error-rate decrease"),
    "max_nfr_mc": Limit("nfr_mc", upper=True, on_flips=False,
                        label="NFR_mc (new wrong and changed)"),
    "max_expected_cost": Limit("expected_cost", upper=True, on_flips=False,
                               label="the expected cost per sample", rate=False),
    "max_nfr_vs_history": Limit("history_nfr", upper=True, on_flips=False,
                                label="the share broken of what earlier production versions "
                                      "got right"),
}
GROUP_LIMITS = {
    "max_group_nfr": Limit("nfr", upper=True, on_flips=False, label="NFR"),
    "max_group_er_increase": Limit("er_increase", upper=True, on_flips=False,
                                   label="the error-rate increase"),
}
LABEL_GROUP_LIMITS = {  # a multi-label pair's limits on each group: NFR_sample, Hamming loss
    "max_group_nfr": Limit("nfr", upper=True, on_flips=False, label="NFR_sample"),
    "max_group_er_increase": Limit("er_increase", upper=True, on_flips=False,
                                   label="the Hamming-loss increase"),
}


SAMPLE_LIMITS = {  # a multi-label pair's limits on its per-sample figures
    "max_nfr": Limit("nfr", upper=True, on_flips=True, label="NFR_sample"),
    "max_nfr_upper": Limit("nfr_upper", upper=True, on_flips=True,
                           label="the upper end of NFR_sample's 95% interval"),
    "max_churn": Limit("churn", upper=True, on_flips=False, label="churn_sample"),
}
LABEL_LIMITS = {  # a multi-label pair's limits on each label
    "max_label_nfr": Limit("nfr", upper=True, on_flips=True, label="NFR"),
    "max_lost_positives": Limit("lost_positive_rate", upper=True, on_flips=True,
                                label="the share of lost positives"),
}

MEASURED_REPORT_KEYS = ("per_class", "nfr_mc", "per_group", "per_label")  # measured_metrics
LABEL_COST_KEYS = ("flipped_indices", "fixed_indices")  # and those a label cost weighs


def measured_metrics(row: PairMetrics, report: dict[str, Any], policy: Policy,
                     history: dict[str, Any] | None = None, *,
                     class_names: list[str] | None = None) -> dict[str, Any]:
    """The numbers a policy is checked against, from one stored pair's columns and the
    MEASURED_REPORT_KEYS of its report (and the history measurement, when the policy has a
    history limit); the worst class is named by the line's `class_names` where it has them.
    A multi-label pair's are `label_metrics`; either kind's groups are `_groups`."""
    if report.get("per_label") is not None:
        return {**label_metrics(row, report, policy), **_group_metrics(report, policy)}
    worst = max(report["per_class"], key=lambda entry: entry["nfr"] or 0.0)
    measured = {
        "n": row.n, "er_old": row.er_old, "er_new": row.er_new,
        "er_increase": row.er_new - row.er_old, "er_decrease": row.er_old - row.er_new,
        "nfr": row.nfr, "nfr_interval": [row.nfr_ci_low, row.nfr_ci_high],
        "nfr_upper": row.nfr_ci_high, "rel_nfr": row.rel_nfr, "pfr": row.pfr,
        "churn": row.churn, "negative_flips": row.negative_flips,
        "positive_flips": row.positive_flips, "mcnemar_p": row.mcnemar_p,
        "worst_class": worst["class"], "worst_class_nfr": worst["nfr"] or 0.0,
        "worst_class_name": class_label(worst["class"], class_names),
        "nfr_mc": report.get("nfr_mc"),
    }
    if policy.weighs_costs:
        measured.update(_cost(row, policy))
    return {**measured, **_group_metrics(report, policy), **(history or {})}


def label_metrics(row: PairMetrics, report: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """The numbers a multi-label pair is checked against: its per-sample NFR (with its 95%
    interval and that interval's upper end), PFR and churn, and per label (by name) its NFR,
    negative flips, lost positives (a count, and a share of the samples) and one-sided McNemar
    p; when the policy weighs costs, `_label_cost` too (each label's share: `expected_cost`)."""
    labels = [{"label": entry["name"], "nfr": entry["nfr"],
               "negative_flips": entry["negative_flips"],
               "lost_positives": entry["lost_positives"],
               "lost_positive_rate": entry["lost_positives"] / row.n,
               "mcnemar_p": entry["mcnemar_p"]} for entry in report["per_label"]]
    measured = {
        "multilabel": True, "n": row.n, "nfr": row.nfr,
        "nfr_interval": [row.nfr_ci_low, row.nfr_ci_high], "nfr_upper": row.nfr_ci_high,
        "pfr": row.pfr, "churn": row.churn, "negative_flips": row.negative_flips,
        "positive_flips": row.positive_flips, "labels": labels,
    }
    if policy.weighs_costs:
        measured.update(_label_cost(row.n, report, policy, labels))
    return measured


def _label_cost(n: int, report: dict[str, Any], policy: Policy,
                labels: list[dict[str, Any]]) -> dict[str, Any]:
    """The expected cost per sample under the policy's per-label weights, its interval and
    p-value (flipgate.metrics.cost.label_update_cost), each label's share added to its entry
    of `labels`; None for a pair measured before its report kept each label's fixed samples."""
    if report.get("fixed_indices") is None:
        return {"expected_cost": None, "expected_cost_ci": None, "cost_p": None}
    names = [entry["label"] for entry in labels]
    costs, gains = policy.label_weights(names)
    result = label_update_cost(n, [report["flipped_indices"][name] for name in names],
                               [report["fixed_indices"][name] for name in names],
                               costs=costs, gains=gains)
    for entry, share in zip(labels, result.per_label, strict=True):
        entry["expected_cost"] = share
    return {"expected_cost": result.cost, "expected_cost_ci": list(result.interval),
            "cost_p": result.p_value}


def _cost(row: PairMetrics, policy: Policy) -> dict[str, Any]:
    """The expected cost per sample under the policy's costs, its interval and p-value."""
    cost, gain = policy.costs
    result = update_cost(row.negative_flips, row.positive_flips, row.n,
                         negative_flip_cost=cost, positive_flip_gain=gain)
    return {"expected_cost": result.cost, "expected_cost_ci": list(result.interval),
            "cost_p": result.p_value}


def _group_metrics(report: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """The `groups` of a report with a per-group table (none without one)."""
    if report.get("per_group") is None:
        return {}
    return {"groups": _groups(report["per_group"], policy.min_group_size or 1)}


def _groups(rows: list[dict[str, Any]], min_size: int) -> list[dict[str, Any]]:
    """Each group's size, flips and rates (a multi-label group's: per sample, and its Hamming
    loss as its error rates); `gated` false below the policy's minimum size."""
    return [{"group": row["group"], "n": row["n"], "gated": row["n"] >= min_size,
             "er_old": row["er_old"], "er_new": row["er_new"],
             "er_increase": row["er_new"] - row["er_old"], "nfr": row["nfr"],
             "negative_flips": row["negative_flips"], "positive_flips": row["positive_flips"]}
            for row in rows]


def check(policy: Policy, measured: dict[str, dict[str, Any]]) -> tuple[Verdict, list[dict]]:
    """The verdict on per-eval-set metrics and the reasons: every exceeded limit, with
    `blocking` false where the significance test waived it; pending when nothing blocks and
    a traffic set needs labels to decide (service.gate.traffic)."""
    reasons = [reason for evalset, metrics in measured.items()
               for reason in _check_set(policy, evalset, metrics)]
    if any(reason["blocking"] for reason in reasons):
        return Verdict.BLOCK, reasons
    pending = any(reason.get("pending") for reason in reasons)
    return (Verdict.PENDING if pending else Verdict.APPROVE), reasons


def _check_set(policy: Policy, evalset: str, metrics: dict[str, Any]) -> list[dict]:
    """The reasons of one eval set (or traffic set)."""
    if metrics.get("traffic"):
        return check_traffic(policy, evalset, metrics, lambda code, name, value, bound: _reason(
            code, name, value, bound, LIMITS[code], blocking=True))
    if metrics.get("multilabel"):
        return [*_check_labels(policy, evalset, metrics),
                *_check_groups(policy, evalset, metrics.get("groups", []), LABEL_GROUP_LIMITS)]
    return [*_check_one(policy, evalset, metrics),
            *_check_groups(policy, evalset, metrics.get("groups", []))]


def _check_one(policy: Policy, evalset: str, metrics: dict[str, Any]) -> list[dict]:
    p_value = metrics["cost_p" if policy.significance_test == "cost" else "mcnemar_p"]
    significant = policy.significance is None or p_value < policy.significance
    reasons = [_reason(name, evalset, metrics[limit.metric], bound, limit,
                       blocking=significant or not limit.on_flips,
                       interval=metrics.get(f"{limit.metric}_interval"))
               for name, limit in LIMITS.items()
               if (bound := _bound(policy, name)) is not None
               and metrics.get(limit.metric) is not None
               and limit.violated(metrics[limit.metric], bound)]
    flip_limits = [name for name, limit in LIMITS.items()
                   if limit.on_flips and getattr(policy, name) is not None]
    if policy.significance is not None and significant and not flip_limits:
        reasons.append(_significance_reason(policy, evalset, p_value))
    return [_with_class(_with_versions(reason, metrics), metrics) for reason in reasons]


def _check_labels(policy: Policy, evalset: str, metrics: dict[str, Any]) -> list[dict]:
    """The reasons of a multi-label pair: its per-sample limits, each label over a label
    limit (naming it), and, with `significance` and no limit on flips, each label whose
    McNemar test finds more new errors than fixes at significance / L (Bonferroni); a
    multi-label reason always blocks."""
    reasons = [_reason(name, evalset, metrics[limit.metric], bound, limit, blocking=True,
                       interval=metrics.get(f"{limit.metric}_interval"))
               for name, limit in SAMPLE_LIMITS.items()
               if (bound := getattr(policy, name)) is not None
               and metrics[limit.metric] is not None and limit.violated(metrics[limit.metric],
                                                                        bound)]
    labels = metrics["labels"]
    reasons += _unknown_labels(policy, evalset, [entry["label"] for entry in labels])
    reasons += [_label_reason(name, evalset, entry, entry[limit.metric], bound,
                              f"{limit.label} {_sentence(limit, entry[limit.metric], bound)}")
                for entry in labels for name, limit in LABEL_LIMITS.items()
                if (bound := _label_bound(getattr(policy, name), entry["label"])) is not None
                and limit.violated(entry[limit.metric], bound)]
    flip_limits = [name for name in (*SAMPLE_LIMITS, *LABEL_LIMITS)
                   if getattr(policy, name) is not None and name != "max_churn"]
    tested = policy.significance is not None and not flip_limits
    reasons += _label_cost_reasons(policy, evalset, metrics,
                                   tested=tested and policy.significance_test == "cost")
    if tested and policy.significance_test != "cost":
        level = policy.significance / len(labels)
        reasons += [_label_reason("significance", evalset, entry, entry["mcnemar_p"], level,
                                  "the one-sided McNemar p (more new errors than fixes) "
                                  f"{entry['mcnemar_p']:.3g} is below the level {level:.3g}")
                    for entry in labels if entry["mcnemar_p"] < level]
    return reasons


def _label_cost_reasons(policy: Policy, evalset: str, metrics: dict[str, Any], *,
                        tested: bool) -> list[dict]:
    """A multi-label pair's blocking reasons on its expected cost: above max_expected_cost,
    and (`tested`) raised by the one-sided test at `significance`, each naming the labels
    that add most; one reason when the pair's cost cannot be weighed."""
    checked = [name for name, applies in (("max_expected_cost", policy.max_expected_cost
                                           is not None), ("significance", tested)) if applies]
    if checked and metrics["expected_cost"] is None:
        return [{"code": "label_costs_not_measured", "evalset": evalset, "measured": None,
                 "limit": None, "blocking": True,
                 "message": f"on {evalset}: the pair was measured before its report kept each "
                            f"label's fixed samples, so {' and '.join(checked)} cannot weigh "
                            "its expected cost"}]
    cost, reasons = metrics.get("expected_cost"), []
    if "max_expected_cost" in checked and cost > policy.max_expected_cost:
        reasons.append(_reason("max_expected_cost", evalset, cost, policy.max_expected_cost,
                               LIMITS["max_expected_cost"], blocking=True))
    if tested and metrics["cost_p"] < policy.significance:
        reasons.append({**_reason("significance", evalset, metrics["cost_p"],
                                  policy.significance, None, blocking=True),
                        "message": f"on {evalset}: the update raises the expected cost "
                                   f"{cost:.4g} per sample (one-sided p = "
                                   f"{metrics['cost_p']:.3g} < {policy.significance})"})
    return [_naming_costliest(reason, metrics["labels"]) for reason in reasons]


def _naming_costliest(reason: dict, labels: list[dict[str, Any]]) -> dict:
    """A cost reason names the (up to three) labels that add most to the cost, the first as
    its `label`."""
    costliest = sorted((entry for entry in labels if entry["expected_cost"] > 0),
                       key=lambda entry: -entry["expected_cost"])[:3]
    if not costliest:
        return reason
    named = ", ".join(f"{entry['label']!r} ({entry['expected_cost']:.3g})"
                      for entry in costliest)
    plural = "s" if len(costliest) > 1 else ""
    return {**reason, "label": costliest[0]["label"],
            "message": f"{reason['message']}; most from label{plural} {named}"}


def _unknown_labels(policy: Policy, evalset: str, names: list[str]) -> list[dict]:
    """A blocking reason per label that a per-label map names and the pair's report does
    not have: a limit that names no label would block nothing."""
    return [{"code": "unknown_label", "evalset": evalset, "label": label, "blocking": True,
             "measured": None, "limit": None,
             "message": f"on {evalset}: {name} names label {label!r}, which the eval set "
                        f"does not have (its labels are {names[:20]})"}
            for name, labels in policy.named_labels().items()
            for label in labels if label not in names]


def _label_bound(limit: float | dict[str, float] | None, label: str) -> float | None:
    """A label limit's bound for `label`: the one limit, or the label's entry of a map."""
    return limit.get(label) if isinstance(limit, dict) else limit


def _label_reason(code: str, evalset: str, entry: dict[str, Any], measured: float,
                  limit: float, finding: str) -> dict:
    """A blocking reason that names the label it is about (`finding`: what is over what)."""
    return {"code": code, "evalset": evalset, "label": entry["label"], "measured": measured,
            "limit": limit, "blocking": True,
            "message": f"on {evalset}, label {entry['label']!r}: {finding}"}


def _with_class(reason: dict, metrics: dict[str, Any]) -> dict:
    """The worst-class reason names the class."""
    if reason["code"] != "max_class_nfr":
        return reason
    return {**reason, "message": reason["message"].replace(
        "the worst class's NFR", f"the NFR of class {metrics['worst_class_name']}")}


def _with_versions(reason: dict, metrics: dict[str, Any]) -> dict:
    """A history reason names the production versions it was measured against."""
    if reason["code"] != "max_nfr_vs_history":
        return reason
    versions = metrics["history_versions"]
    return {**reason, "versions": versions, "message": reason["message"].replace(
        "earlier production versions", f"production versions {', '.join(versions)}")}


def _bound(policy: Policy, name: str) -> float | None:
    """The policy's bound for a limit (the share, for the history limit)."""
    value = getattr(policy, name)
    return value.max if isinstance(value, HistoryLimit) else value


def _check_groups(policy: Policy, evalset: str, groups: list[dict[str, Any]],
                  limits: dict[str, Limit] = GROUP_LIMITS) -> list[dict]:
    """A blocking reason per gated group over a group limit, naming the group."""
    return [{**_reason(name, evalset, group[limit.metric], bound, limit, blocking=True),
             "group": group["group"], "message": f"on {evalset}, group {group['group']!r} "
             f"(n = {group['n']}): {limit.label} {_sentence(limit, group[limit.metric], bound)}"}
            for group in groups if group["gated"]
            for name, limit in limits.items()
            if (bound := getattr(policy, name)) is not None
            and group[limit.metric] is not None and limit.violated(group[limit.metric], bound)]


def _significance_reason(policy: Policy, evalset: str, p_value: float) -> dict:
    """The reason of a block by the significance test alone."""
    reason = _reason("significance", evalset, p_value, policy.significance, None, blocking=True)
    if policy.significance_test == "cost":
        cost, gain = policy.costs
        reason["message"] = (f"on {evalset}: the update raises the expected cost (negative flip "
                             f"{cost}, positive flip {gain}; one-sided p = {p_value:.3g} < "
                             f"{policy.significance})")
    return reason


def _reason(code: str, evalset: str, measured: float, limit: float, spec: Limit | None, *,
            blocking: bool, interval: list[float] | None = None) -> dict:
    """One entry of a decision's reasons; `interval`: the measured rate's 95% interval."""
    if spec is None:
        message = (f"on {evalset}: the candidate makes more new errors than it fixes "
                   f"(one-sided McNemar p = {measured:.3g} < {limit})")
    else:
        message = f"on {evalset}: {spec.label} {_sentence(spec, measured, limit, interval)}"
        if not blocking:
            message += " (waived: the flips are not significant)"
    return {"code": code, "evalset": evalset, "measured": measured, "limit": limit,
            "blocking": blocking, "message": message}


def _sentence(spec: Limit, measured: float, limit: float,
              interval: list[float] | None = None) -> str:
    """'20.27% (95% interval 18.10% – 22.60%) is above the maximum 3%'."""
    shown, bound = spec.figures(measured, limit, interval)
    return f"{shown} is {'above the maximum' if spec.upper else 'below the minimum'} {bound}"
