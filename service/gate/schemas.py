"""Wire schemas of the gate: webhook requests, decisions, policies, promotion and repair."""

from datetime import datetime
from typing import Annotated, Any

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, StrictBool

from service.gate.models import Verdict
from service.gate.rules import MAX_POLICY_EVALSETS, EvalsetName, Policy, Rate, RateChange
from service.jobs.schemas import JobRead
from service.names import NAME, VERSION

MAX_SEED = 2**63 - 1  # a training seed is a signed 64-bit integer where the trainer uses it

VersionName = Annotated[str, Field(pattern=f"^{VERSION.pattern}$")]


class CiContext(BaseModel):
    """Where the request comes from; stored with the decision for the audit log."""

    model_config = ConfigDict(extra="forbid")

    provider: str | None = Field(None, max_length=100)
    repo: str | None = Field(None, max_length=300)
    sha: str | None = Field(None, max_length=100)
    ref: str | None = Field(None, max_length=300)
    run_url: str | None = Field(None, max_length=2000)


class GateRequest(BaseModel):
    """May `candidate` replace `baseline` (default: the line's production version)?"""

    model_config = ConfigDict(extra="forbid")

    project: Annotated[str | None, Field(pattern=f"^{NAME.pattern}$", description=(
        "the line's project: a bearer token's own by default, `default` for a signed "
        "request"))] = None
    model: Annotated[str, Field(pattern=f"^{NAME.pattern}$")]
    candidate: VersionName
    baseline: VersionName | None = Field(None,
                                         description="a version of the line; default: production")
    evalsets: list[EvalsetName] = Field(default_factory=list, max_length=MAX_POLICY_EVALSETS,
                                        description="added to the policy's eval sets")
    ci: CiContext | None = None
    callback_url: AnyHttpUrl | None = Field(None, description="receives the final status")


class CallbackRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    state: str
    attempts: int
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None


class DecisionRead(BaseModel):
    """The gate's answer; `reasons` name every exceeded limit with the measured value."""

    decision_id: int
    verdict: Verdict
    reasons: list[dict[str, Any]]
    metrics: dict[str, Any]
    report_url: str | None
    model: str
    candidate: str
    baseline: str | None
    evalsets: list[str]
    policy_version: int | None
    policy: dict[str, Any]
    requested_by: str
    ci: dict[str, Any] | None
    callback_url: str | None
    callback: CallbackRead | None
    waiting_for: list[int] = Field(description="ids of the jobs a pending decision waits for")
    labels_needed: int | None = Field(None, description="pending on traffic sets: the "
                                      "disagreements still unlabelled (labels_needed reasons)")
    repair_of: int | None
    created_at: datetime
    decided_at: datetime | None


class PolicyRead(BaseModel):
    model: str
    version: int | None = Field(description="None: no policy was set; the default applies")
    rules: Policy
    created_by: str | None
    created_at: datetime | None


class UnstableSample(BaseModel):
    index: int = Field(description="the sample's position in the eval set")
    changes: int = Field(description="how often its correctness changed between consecutive "
                                     "production versions")
    label: int
    correct: list[bool] = Field(description="right or wrong under each of `versions`")


class UnstableSamples(BaseModel):
    """The samples that flipped most often across the line's production history."""

    model: str
    evalset: str
    versions: list[str] = Field(description="the production versions with predictions on "
                                            "the eval set, oldest first")
    samples: list[UnstableSample]


class VerdictChange(BaseModel):
    decision_id: int
    candidate: str
    baseline: str | None
    old_verdict: Verdict
    new_verdict: Verdict
    reasons: list[dict[str, Any]] = Field(description="the draft policy's reasons")


class DryRun(BaseModel):
    """What a draft policy would have decided on the line's past final decisions."""

    model: str
    replayed: int = Field(description="final decisions that compared a pair")
    changed: list[VerdictChange]


class SecretCreated(BaseModel):
    secret: str = Field(description="shown once; sign deliveries with HMAC-SHA256 of the body")


class AliasMove(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str
    force: bool = Field(False, description="promote without an approval (scope admin)")


class PromotionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    from_version_id: int | None
    to_version_id: int
    decision_id: int | None
    forced: bool
    requested_by: str
    created_at: datetime


class TrainingSettings(BaseModel):
    """TrainConfig fields; unset ones come from the candidate's run record, else defaults."""

    model_config = ConfigDict(extra="forbid")

    epochs: Annotated[int, Field(ge=1)] | None = None
    batch_size: Annotated[int, Field(ge=1)] | None = None
    lr: Annotated[float, Field(gt=0)] | None = None
    weight_decay: Annotated[float, Field(ge=0)] | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None


class RepairRequest(BaseModel):
    """Repair a blocked candidate: retrain it with a method that removes flips, or (methods
    `interpolate` and `ensemble`) mix it with the baseline on their ONNX files alone, with the
    baseline's share chosen on a calibration eval set."""

    model_config = ConfigDict(extra="forbid")

    method: str = "elodi"
    options: dict[str, Any] = Field(default_factory=dict, description="the method's options "
                                    "(ensemble: {\"probabilities\": true} mixes probabilities)")
    config: TrainingSettings = Field(default_factory=TrainingSettings)
    arch: str | None = Field(None, description="default: the candidate's recorded arch")
    dataset: str | None = Field(None, description="default: the line's training data set")
    version: str | None = Field(None, description="default: <candidate>-<method>")
    calibration: EvalsetName | None = Field(
        None, description="interpolate and ensemble (required): the eval set the baseline's "
                          "share is chosen on; none the decision was gated on")
    max_nfr: Rate | None = Field(None, description="interpolate and ensemble: NFR on the "
                                 "calibration set; default: the policy's max_nfr, else 0.01")
    max_er_increase: RateChange | None = Field(
        None, description="interpolate and ensemble: error above the baseline's on the "
                          "calibration set; default: the policy's bound on it, else 0")


class InterpolateOptions(BaseModel):
    """Interpolation has no options."""

    model_config = ConfigDict(extra="forbid")


class EnsembleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    probabilities: StrictBool = Field(False, description="mix softmax probabilities (the "
                                      "output is their log) instead of logits")


ONNX_REPAIR_OPTIONS: dict[str, type[BaseModel]] = {"interpolate": InterpolateOptions,
                                                   "ensemble": EnsembleOptions}


class RepairQueued(BaseModel):
    job: JobRead
    status_url: str
