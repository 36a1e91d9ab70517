"""A gate policy's limits and how a candidate's measured metrics are checked against them."""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flipgate.metrics.cost import update_cost
from flipgate.reporting.rows import class_label
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
    negative_flip_cost: Weight | None = Field(None, description="default 1")
    positive_flip_gain: Weight | None = Field(None, description="default 1")
    max_expected_cost: CostPerSample | None = Field(
        None, description="(cost·NF − gain·PF) / N")
    max_nfr_vs_history: HistoryLimit | None = None
    evalsets: list[EvalsetName] = Field(default_factory=list, max_length=MAX_POLICY_EVALSETS,
                                        description="eval sets every gate uses")

    @field_validator("evalsets")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        return list(dict.fromkeys(names))

    @field_validator("negative_flip_cost")
    @classmethod
    def _positive_cost(cls, cost: float | None) -> float | None:
        if cost == 0:
            raise ValueError("a negative flip must cost more than 0")
        return cost

    @property
    def costs(self) -> tuple[float, float]:
        """The cost of a negative flip and the gain of a positive one (default 1 and 1)."""
        return (1.0 if self.negative_flip_cost is None else self.negative_flip_cost,
                1.0 if self.positive_flip_gain is None else self.positive_flip_gain)

    @property
    def weighs_costs(self) -> bool:
        """Whether the decision measures the expected cost."""
        return (self.max_expected_cost is not None or self.significance_test == "cost"
                or self.negative_flip_cost is not None or self.positive_flip_gain is not None)


DEFAULT_POLICY = Policy(significance=0.05)


@dataclass(frozen=True)
class Limit:
    """A policy field: the metric it bounds, from above or below, and what it is called."""

    metric: str
    upper: bool
    on_flips: bool
    label: str

    def violated(self, value: float, bound: float) -> bool:
        return value > bound if self.upper else value < bound


LIMITS = {
    "max_nfr": Limit("nfr", upper=True, on_flips=True, label="NFR"),
    "max_nfr_upper": Limit("nfr_upper", upper=True, on_flips=True,
                           label="the upper end of NFR's 95% interval"),
    "max_rel_nfr": Limit("rel_nfr", upper=True, on_flips=True, label="relative NFR"),
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
                               label="the expected cost per sample"),
    "max_nfr_vs_history": Limit("history_nfr", upper=True, on_flips=False,
                                label="the share broken of what earlier production versions "
                                      "got right"),
}
GROUP_LIMITS = {
    "max_group_nfr": Limit("nfr", upper=True, on_flips=False, label="NFR"),
    "max_group_er_increase": Limit("er_increase", upper=True, on_flips=False,
                                   label="the error-rate increase"),
}


MEASURED_REPORT_KEYS = ("per_class", "nfr_mc", "per_group")  # what measured_metrics reads


def measured_metrics(row: PairMetrics, report: dict[str, Any], policy: Policy,
                     history: dict[str, Any] | None = None, *,
                     class_names: list[str] | None = None) -> dict[str, Any]:
    """The numbers a policy is checked against, from one stored pair's columns and the
    MEASURED_REPORT_KEYS of its report (and the history measurement, when the policy has a
    history limit); the worst class is named by the line's `class_names` where it has them."""
    worst = max(report["per_class"], key=lambda entry: entry["nfr"] or 0.0)
    measured = {
        "n": row.n, "er_old": row.er_old, "er_new": row.er_new,
        "er_increase": row.er_new - row.er_old, "er_decrease": row.er_old - row.er_new,
        "nfr": row.nfr, "nfr_upper": row.nfr_ci_high, "rel_nfr": row.rel_nfr, "pfr": row.pfr,
        "churn": row.churn, "negative_flips": row.negative_flips,
        "positive_flips": row.positive_flips, "mcnemar_p": row.mcnemar_p,
        "worst_class": worst["class"], "worst_class_nfr": worst["nfr"] or 0.0,
        "worst_class_name": class_label(worst["class"], class_names),
        "nfr_mc": report.get("nfr_mc"),
    }
    if policy.weighs_costs:
        measured.update(_cost(row, policy))
    if report.get("per_group") is not None:
        measured["groups"] = _groups(report["per_group"], policy.min_group_size or 1)
    return {**measured, **(history or {})}


def _cost(row: PairMetrics, policy: Policy) -> dict[str, Any]:
    """The expected cost per sample under the policy's costs, its interval and p-value."""
    cost, gain = policy.costs
    result = update_cost(row.negative_flips, row.positive_flips, row.n,
                         negative_flip_cost=cost, positive_flip_gain=gain)
    return {"expected_cost": result.cost, "expected_cost_ci": list(result.interval),
            "cost_p": result.p_value}


def _groups(rows: list[dict[str, Any]], min_size: int) -> list[dict[str, Any]]:
    """Each group's size, flips and rates; `gated` false below the policy's minimum size."""
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
    return [*_check_one(policy, evalset, metrics),
            *_check_groups(policy, evalset, metrics.get("groups", []))]


def _check_one(policy: Policy, evalset: str, metrics: dict[str, Any]) -> list[dict]:
    p_value = metrics["cost_p" if policy.significance_test == "cost" else "mcnemar_p"]
    significant = policy.significance is None or p_value < policy.significance
    reasons = [_reason(name, evalset, metrics[limit.metric], bound, limit,
                       blocking=significant or not limit.on_flips)
               for name, limit in LIMITS.items()
               if (bound := _bound(policy, name)) is not None
               and metrics.get(limit.metric) is not None
               and limit.violated(metrics[limit.metric], bound)]
    flip_limits = [name for name, limit in LIMITS.items()
                   if limit.on_flips and getattr(policy, name) is not None]
    if policy.significance is not None and significant and not flip_limits:
        reasons.append(_significance_reason(policy, evalset, p_value))
    return [_with_class(_with_versions(reason, metrics), metrics) for reason in reasons]


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


def _check_groups(policy: Policy, evalset: str, groups: list[dict[str, Any]]) -> list[dict]:
    """A blocking reason per gated group over a group limit, naming the group."""
    return [{**_reason(name, evalset, group[limit.metric], bound, limit, blocking=True),
             "group": group["group"], "message": f"on {evalset}, group {group['group']!r} "
             f"(n = {group['n']}): {limit.label} {group[limit.metric]:.4g} is above the "
             f"maximum {bound}"}
            for group in groups if group["gated"]
            for name, limit in GROUP_LIMITS.items()
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
            blocking: bool) -> dict:
    """One entry of a decision's reasons."""
    if spec is None:
        message = (f"on {evalset}: the candidate makes more new errors than it fixes "
                   f"(one-sided McNemar p = {measured:.3g} < {limit})")
    else:
        relation = "above the maximum" if spec.upper else "below the minimum"
        message = f"on {evalset}: {spec.label} {measured:.4g} is {relation} {limit}"
        if not blocking:
            message += " (waived: the flips are not significant)"
    return {"code": code, "evalset": evalset, "measured": measured, "limit": limit,
            "blocking": blocking, "message": message}
