"""Endpoints of the deploy gate: policies, webhook secrets, the CI webhook, decisions and
repair (promotion: service.gate.promotion_router, beside it in service.main.ROUTERS)."""

import hashlib
import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from service import urls
from service.datasets.models import DatasetRole
from service.datasets.service import get_dataset_of_role
from service.deps import (
    ADMIN,
    READ,
    WRITE,
    CommittingRoute,
    Credentials,
    SessionDep,
    SettingsDep,
    StoreDep,
    TokenDep,
    act_signed,
    authorize,
    presented_token,
    reading,
    require,
)
from service.errors import InvalidInput, NotFound, describe_problems
from service.gate import decisions, dry_run, history, policies, repair_requests, webhook_secrets
from service.gate.evidence import read_history
from service.gate.models import Verdict
from service.gate.rules import Policy
from service.gate.schemas import (
    DecisionRead,
    DryRun,
    GateRequest,
    PolicyRead,
    RepairQueued,
    RepairRequest,
    SecretCreated,
    UnstableSamples,
)
from service.gate.views import decision_view, decision_views
from service.gate.webhook_auth import (
    DeliveryHeader,
    RawBody,
    SignatureHeader,
    webhook_signature,
)
from service.jobs.schemas import JobRead
from service.names import NAME_LENGTH
from service.projects.models import DEFAULT_PROJECT, Project
from service.projects.scoping import scope_session
from service.projects.service import get_project
from service.registry.service import get_line

router = APIRouter(tags=["gate"], route_class=CommittingRoute)
DecisionId = Annotated[int, Path(ge=1, lt=2**31)]
WEBHOOK = "webhook"  # who gates with a signature, for the decision and the audit trail


@router.put("/models/{name}/policy", response_model=PolicyRead, dependencies=[ADMIN])
def put_policy(name: str, policy: Policy, session: SessionDep, token: TokenDep) -> PolicyRead:
    """Set the line's policy; it becomes a new version, and decisions record the version
    they used."""
    row = policies.put_policy(session=session, line_name=name, policy=policy,
                              created_by=token.name)
    return policies.policy_read(name=name, row=row)


@router.get("/models/{name}/policy", response_model=PolicyRead, dependencies=[READ])
def read_policy(name: str, session: SessionDep,
                version: Annotated[int | None, Query(ge=1, lt=2**31)] = None) -> PolicyRead:
    """The line's current policy (or one of its versions); version null: none was set and
    the default applies."""
    if version is not None:
        row = policies.get_policy(session=session, line_name=name, version=version)
    else:
        line = get_line(session=session, name=name)
        row = policies.current_policy(session=session, line=line)
    return policies.policy_read(name=name, row=row)


@router.post("/models/{name}/policy/dry-run", response_model=DryRun, dependencies=[READ])
def dry_run_policy(name: str, policy: Policy, session: SessionDep,
                   settings: SettingsDep) -> DryRun:
    """Replay a draft policy on the line's past final decisions (their eval sets and stored
    metrics) and list the verdicts it would change; nothing is stored."""
    return dry_run.dry_run(session=session, settings=settings, line_name=name, policy=policy)


@router.get("/models/{name}/unstable-samples", response_model=UnstableSamples,
            dependencies=[READ])
def read_unstable_samples(name: str, session: SessionDep, store: StoreDep,
                          evalset: Annotated[str, Query(max_length=NAME_LENGTH)],
                          limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                          ) -> UnstableSamples:
    """The eval set's samples whose correctness changed between consecutive production
    versions, most often first (only samples that changed at least once)."""
    dataset = get_dataset_of_role(session=session, name=evalset, role=DatasetRole.EVAL)
    return history.unstable_samples(session=session, store=store, line_name=name,
                                    dataset=dataset, limit=limit)


@router.post("/models/{name}/webhook-secret", response_model=SecretCreated, status_code=201,
             dependencies=[ADMIN])
def rotate_webhook_secret(name: str, session: SessionDep,
                          settings: SettingsDep) -> SecretCreated:
    """A new secret for signing the line's webhook deliveries, shown once; the previous one
    keeps working for FLIPGATE_SECRET_GRACE_SECONDS."""
    secret = webhook_secrets.rotate_secret(session=session, settings=settings, line_name=name)
    return SecretCreated(secret=secret)


@router.post("/gate", response_model=DecisionRead,
             responses={202: {"model": DecisionRead, "description": "pending: measuring"}})
def gate(request: Request, body: RawBody, session: SessionDep, settings: SettingsDep,
         store: StoreDep, credentials: Credentials, signature: SignatureHeader = None,
         delivery: DeliveryHeader = None) -> JSONResponse:
    """May the candidate replace the baseline? Authenticated by a bearer token with scope
    `gate`, or by `X-Flipgate-Signature-256: t=<unix seconds>,v1=<hex HMAC-SHA256 of
    "<t>." + body>` under the line's webhook secret, within FLIPGATE_SIGNATURE_TOLERANCE_SECONDS
    of the server's clock; `X-Flipgate-Delivery` makes retries return the first decision.
    Answers 202 while the measurements it queued are running (poll GET /gate/decisions/{id});
    `Server-Timing` gives the gate's own time.

    The answer is rendered here, in the endpoint's thread, not validated afterwards in
    another one: under load every pool thread may be waiting for SQLite's write lock, which
    this request holds until its session commits after the endpoint returns. For the same
    reason the signature is checked, and a history limit's arrays read, before that session
    begins. Its caller, for the audit trail, is the token or (signed) `webhook`."""
    started = time.perf_counter()
    gate_request = parse_gate_request(body)
    with reading(request) as reader:
        if credentials is not None:
            token = presented_token(request, credentials)
            project = authorize(request, reader, token, gate_request.project, "gate").project
            caller, signed = token.name, None
        else:
            project = signed_project(reader, gate_request)
            caller, signed = WEBHOOK, webhook_signature(
                session=None if project is None else scope_session(reader, project.id),
                settings=settings, line_name=gate_request.model, body=body,
                signature=signature)
            act_signed(request, WEBHOOK, project, ("gate",))
        plan = decisions.history_plan_of(session=scope_session(reader, project.id),
                                         settings=settings, request=gate_request)
    scope_session(session, project.id)
    decision = decisions.gate(session=session, settings=settings, request=gate_request,
                              requested_by=caller, base_url=settings.link_base,
                              delivery_id=delivery, signature_digest=signed,
                              request_sha256=hashlib.sha256(body).hexdigest(),
                              known_history=read_history(store, plan))
    request.state.audit_details = {"decision_id": decision.id, "verdict": decision.verdict}
    answer = decision_view(session=session, decision=decision).model_dump(mode="json")
    return JSONResponse(answer, status_code=202 if decision.verdict == Verdict.PENDING else 200,
                        headers={"Server-Timing": f"gate;dur="
                                 f"{1000 * (time.perf_counter() - started):.2f}"})


def signed_project(session: Session, request: GateRequest) -> Project | None:
    """The project a signed request names (default: `default`); None if there is none, whose
    lines then have no secret: the signature is refused as for a line of none."""
    try:
        return get_project(session=session, name=request.project or DEFAULT_PROJECT)
    except NotFound:
        return None


def parse_gate_request(body: bytes) -> GateRequest:
    """The webhook's JSON body, or a 422 naming what is wrong."""
    try:
        return GateRequest.model_validate_json(body)
    except ValidationError as error:
        raise InvalidInput("invalid_request", describe_problems(error.errors())) from error


@router.get("/gate/decisions/{decision_id}", response_model=DecisionRead,
            dependencies=[require("read", "gate")])
def read_decision(decision_id: DecisionId, session: SessionDep) -> JSONResponse:
    """A decision; poll it while it is pending (it is settled when its jobs end). Rendered
    in the endpoint's thread, as POST /gate's answer is (not validated again in another)."""
    decision = decisions.get_decision(session=session, decision_id=decision_id)
    return JSONResponse(decision_view(session=session, decision=decision).model_dump(mode="json"))


@router.get("/models/{name}/decisions", response_model=list[DecisionRead], dependencies=[READ])
def list_decisions(name: str, session: SessionDep, candidate: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                   before: Annotated[int | None, Query(ge=1, lt=2**31,
                                                       description="older ids only")] = None,
                   ) -> list[DecisionRead]:
    """The line's audit log of decisions, newest first."""
    rows = decisions.list_decisions(session=session, line_name=name, candidate=candidate,
                                    limit=limit, before=before)
    return decision_views(session=session, decisions=rows)


@router.post("/gate/decisions/{decision_id}/repair", response_model=RepairQueued,
             status_code=202, dependencies=[WRITE])
def repair_candidate(decision_id: DecisionId, body: RepairRequest, session: SessionDep,
                     settings: SettingsDep, store: StoreDep, token: TokenDep) -> RepairQueued:
    """Retrain a blocked candidate (default: ELODI, with the legacy term towards a baseline
    not trained with ELODI), or mix it with the baseline on their ONNX files (`interpolate`,
    `ensemble`, tuned on a `calibration` eval set the gate does not decide on); the job
    registers the new version and gates it again."""
    job = repair_requests.request_repair(session=session, settings=settings, store=store,
                                         decision_id=decision_id, repair=body,
                                         requested_by=token.name)
    return RepairQueued(job=JobRead.model_validate(job), status_url=urls.job(job.id))
