"""Endpoints of the deploy gate: policies, the CI webhook, decisions, promotion and repair."""

import hashlib
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from flipgate.signing import signature_matches
from service.auth.models import ApiToken
from service.auth.service import require_scope
from service.config import Settings
from service.deps import (
    ADMIN,
    READ,
    WRITE,
    Credentials,
    SessionDep,
    SettingsDep,
    TokenDep,
    current_token,
    require,
)
from service.errors import Forbidden, InvalidInput, Unauthorized, describe_problems
from service.gate import promotion, repair, service
from service.gate.models import DELIVERY_LENGTH, GatePolicy, Promotion, Verdict
from service.gate.rules import DEFAULT_POLICY, Policy
from service.gate.schemas import (
    AliasMove,
    DecisionRead,
    GateRequest,
    PolicyRead,
    PromotionRead,
    RepairQueued,
    RepairRequest,
    SecretCreated,
)
from service.jobs.schemas import JobRead
from service.registry.models import Alias
from service.registry.schemas import AliasRead
from service.registry.service import PRODUCTION, get_alias, get_line, set_alias

router = APIRouter(tags=["gate"])
SignatureHeader = Annotated[str | None, Header(alias="X-Flipgate-Signature-256")]
DeliveryHeader = Annotated[str | None, Header(alias="X-Flipgate-Delivery",
                                              max_length=DELIVERY_LENGTH)]


async def raw_body(request: Request) -> bytes:
    """The request body exactly as sent (the webhook signature covers these bytes)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]


@router.put("/models/{name}/policy", response_model=PolicyRead, dependencies=[ADMIN])
def put_policy(name: str, policy: Policy, session: SessionDep, token: TokenDep) -> PolicyRead:
    """Set the line's policy; it becomes a new version, and decisions record the version
    they used."""
    return policy_read(name, service.put_policy(session=session, line_name=name, policy=policy,
                                                created_by=token.name))


@router.get("/models/{name}/policy", response_model=PolicyRead, dependencies=[READ])
def read_policy(name: str, session: SessionDep,
                version: Annotated[int | None, Query(ge=1)] = None) -> PolicyRead:
    """The line's current policy (or one of its versions); version null: none was set and
    the default applies."""
    if version is not None:
        row = service.get_policy(session=session, line_name=name, version=version)
    else:
        row = service.current_policy(session=session, line=get_line(session=session, name=name))
    return policy_read(name, row)


def policy_read(name: str, row: GatePolicy | None) -> PolicyRead:
    """A stored policy version, or the default policy when none was ever set."""
    if row is None:
        return PolicyRead(model=name, version=None, rules=DEFAULT_POLICY, created_by=None,
                          created_at=None)
    return PolicyRead(model=name, version=row.version, rules=row.rules,
                      created_by=row.created_by, created_at=row.created_at)


@router.post("/models/{name}/webhook-secret", response_model=SecretCreated, status_code=201,
             dependencies=[ADMIN])
def rotate_webhook_secret(name: str, session: SessionDep) -> SecretCreated:
    """A new secret for signing the line's webhook deliveries, shown once; the previous one
    stops working."""
    return SecretCreated(secret=service.rotate_secret(session=session, line_name=name))


@router.post("/gate", response_model=DecisionRead,
             responses={202: {"model": DecisionRead, "description": "pending: measuring"}})
def gate(request: Request, body: RawBody, session: SessionDep, settings: SettingsDep,
         credentials: Credentials, signature: SignatureHeader = None,
         delivery: DeliveryHeader = None) -> JSONResponse:
    """May the candidate replace the baseline? Authenticated by a bearer token with scope
    `gate`, or by `X-Flipgate-Signature-256: sha256=<HMAC-SHA256 of the body>` under the
    line's webhook secret; `X-Flipgate-Delivery` makes retries return the first decision.
    Answers 202 while the measurements it queued are running (poll GET /gate/decisions/{id});
    `Server-Timing` gives the gate's own time.

    The answer is rendered here, in the endpoint's thread, not validated afterwards in
    another one: under load every pool thread may be waiting for SQLite's write lock, which
    this request holds until its session commits after the endpoint returns."""
    started = time.perf_counter()
    gate_request = parse_gate_request(body)
    caller = (gate_caller(session, settings, credentials) if credentials is not None
              else webhook_caller(session, gate_request.model, body, signature))
    decision = service.gate(session=session, request=gate_request, requested_by=caller,
                            base_url=public_url(request, settings), delivery_id=delivery,
                            request_sha256=hashlib.sha256(body).hexdigest())
    answer = service.decision_view(session=session, decision=decision).model_dump(mode="json")
    return JSONResponse(answer, status_code=202 if decision.verdict == Verdict.PENDING else 200,
                        headers={"Server-Timing": f"gate;dur="
                                 f"{1000 * (time.perf_counter() - started):.2f}"})


def public_url(request: Request, settings: Settings) -> str:
    """The address links in decisions start with: FLIPGATE_PUBLIC_URL, else the request's."""
    return settings.public_url.rstrip("/") + "/" if settings.public_url else str(request.base_url)


def parse_gate_request(body: bytes) -> GateRequest:
    """The webhook's JSON body, or a 422 naming what is wrong."""
    try:
        return GateRequest.model_validate_json(body)
    except ValidationError as error:
        raise InvalidInput("invalid_request", describe_problems(error.errors())) from error


def gate_caller(session: Session, settings: Settings, credentials: Credentials) -> str:
    """The name of a bearer token allowed to ask the gate."""
    token: ApiToken = current_token(session, settings, credentials)
    require_scope(token, "gate")
    return token.name


def webhook_caller(session: Session, line_name: str, body: bytes,
                   signature: str | None) -> str:
    """"webhook" when the body carries a valid signature under the line's secret."""
    if signature is None:
        raise Unauthorized("missing_credentials", "send 'Authorization: Bearer <token>' or "
                           "'X-Flipgate-Signature-256: sha256=<hex HMAC of the body>'")
    secret = service.line_secret(session=session, line_name=line_name)
    if secret is None or not signature_matches(secret, body, signature):
        raise Unauthorized("invalid_signature", "the signature does not match the body "
                           f"under the webhook secret of {line_name!r}")
    return "webhook"


@router.get("/gate/decisions/{decision_id}", response_model=DecisionRead,
            dependencies=[require("read", "gate")])
def read_decision(decision_id: int, session: SessionDep) -> DecisionRead:
    """A decision; poll it while it is pending."""
    service.settle_pending(session=session)
    decision = service.get_decision(session=session, decision_id=decision_id)
    return service.decision_view(session=session, decision=decision)


@router.get("/models/{name}/decisions", response_model=list[DecisionRead], dependencies=[READ])
def list_decisions(name: str, session: SessionDep, candidate: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                   before: Annotated[int | None, Query(description="older ids only")] = None,
                   ) -> list[DecisionRead]:
    """The line's audit log of decisions, newest first."""
    decisions = service.list_decisions(session=session, line_name=name, candidate=candidate,
                                       limit=limit, before=before)
    return [service.decision_view(session=session, decision=row) for row in decisions]


@router.post("/gate/decisions/{decision_id}/repair", response_model=RepairQueued,
             status_code=202, dependencies=[WRITE])
def repair_candidate(decision_id: int, body: RepairRequest, session: SessionDep,
                     token: TokenDep) -> RepairQueued:
    """Retrain a blocked candidate (default: ELODI, with the legacy term towards a baseline
    not trained with ELODI); the job registers the new version and gates it again."""
    job = repair.request_repair(session=session, decision_id=decision_id, repair=body,
                                requested_by=token.name)
    return RepairQueued(job=JobRead.model_validate(job), status_url=f"/jobs/{job.id}")


@router.post("/models/{name}/aliases/{alias}", response_model=AliasRead, dependencies=[WRITE])
def move_alias(name: str, alias: str, body: AliasMove, session: SessionDep,
               token: TokenDep) -> Alias:
    """Point an alias at a version. `production` moves only to a version with an approving
    decision against the current production version, unless `force` (scope admin)."""
    if alias != PRODUCTION:
        return set_alias(session=session, line_name=name, alias=alias, version=body.version)
    if body.force and "admin" not in token.scopes:
        raise Forbidden("missing_scope", "forcing a promotion needs the 'admin' scope")
    promotion.promote(session=session, line_name=name, version=body.version,
                      requested_by=token.name, force=body.force)
    return get_alias(session=session, line_name=name, alias=PRODUCTION)


@router.get("/models/{name}/promotions", response_model=list[PromotionRead],
            dependencies=[READ])
def list_promotions(name: str, session: SessionDep) -> list[Promotion]:
    """Every move of the line's production alias, with the decision that allowed it."""
    return promotion.list_promotions(session=session, line_name=name)
