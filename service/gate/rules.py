"""A gate policy's limits and how a candidate's measured metrics are checked against them."""

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.compare.models import PairMetrics
from service.gate.models import Verdict
from service.names import NAME

# Limits are JSON numbers (strict: "0.1", true and false are refused), finite and bounded.
Rate = Annotated[float, Field(ge=0.0, le=1.0, strict=True, allow_inf_nan=False)]
RateChange = Annotated[float, Field(ge=-1.0, le=1.0, strict=True, allow_inf_nan=False)]
RelativeRate = Annotated[float, Field(ge=0.0, le=1e6, strict=True, allow_inf_nan=False)]
Probability = Annotated[float, Field(gt=0.0, lt=1.0, strict=True, allow_inf_nan=False)]
EvalsetName = Annotated[str, Field(pattern=f"^{NAME.pattern}$")]
MAX_POLICY_EVALSETS = 50


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
    evalsets: list[EvalsetName] = Field(default_factory=list, max_length=MAX_POLICY_EVALSETS,
                                        description="eval sets every gate uses")

    @field_validator("evalsets")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        return list(dict.fromkeys(names))


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
}


def measured_metrics(row: PairMetrics) -> dict[str, Any]:
    """The numbers a policy is checked against, from one stored pair report."""
    worst = max(row.report["per_class"], key=lambda entry: entry["nfr"] or 0.0)
    return {
        "n": row.n, "er_old": row.er_old, "er_new": row.er_new,
        "er_increase": row.er_new - row.er_old, "er_decrease": row.er_old - row.er_new,
        "nfr": row.nfr, "nfr_upper": row.nfr_ci_high, "rel_nfr": row.rel_nfr, "pfr": row.pfr,
        "churn": row.churn, "negative_flips": row.negative_flips,
        "positive_flips": row.positive_flips, "mcnemar_p": row.mcnemar_p,
        "worst_class": worst["class"], "worst_class_nfr": worst["nfr"] or 0.0,
    }


def check(policy: Policy, measured: dict[str, dict[str, Any]]) -> tuple[Verdict, list[dict]]:
    """The verdict on per-eval-set metrics and the reasons: every exceeded limit, with
    `blocking` false where the significance test waived it."""
    reasons = [reason for evalset, metrics in measured.items()
               for reason in _check_one(policy, evalset, metrics)]
    blocked = any(reason["blocking"] for reason in reasons)
    return (Verdict.BLOCK if blocked else Verdict.APPROVE), reasons


def _check_one(policy: Policy, evalset: str, metrics: dict[str, Any]) -> list[dict]:
    significant = policy.significance is None or metrics["mcnemar_p"] < policy.significance
    reasons = [_reason(name, evalset, metrics[limit.metric], bound,
                       blocking=significant or not limit.on_flips)
               for name, limit in LIMITS.items()
               if (bound := getattr(policy, name)) is not None
               and metrics[limit.metric] is not None
               and limit.violated(metrics[limit.metric], bound)]
    flip_limits = [name for name, limit in LIMITS.items()
                   if limit.on_flips and getattr(policy, name) is not None]
    if policy.significance is not None and significant and not flip_limits:
        reasons.append(_reason("significance", evalset, metrics["mcnemar_p"],
                               policy.significance, blocking=True))
    return reasons


def _reason(code: str, evalset: str, measured: float, limit: float, *, blocking: bool) -> dict:
    """One entry of a decision's reasons."""
    if code == "significance":
        message = (f"on {evalset}: the candidate makes more new errors than it fixes "
                   f"(one-sided McNemar p = {measured:.3g} < {limit})")
    else:
        spec = LIMITS[code]
        relation = "above the maximum" if spec.upper else "below the minimum"
        message = f"on {evalset}: {spec.label} {measured:.4g} is {relation} {limit}"
        if not blocking:
            message += " (waived: the flips are not significant)"
    return {"code": code, "evalset": evalset, "measured": measured, "limit": limit,
            "blocking": blocking, "message": message}
