"""The MLflow connector's bookkeeping: MLflow's webhook signature, deliveries acted on once,
the jobs that do the work, and the connector's log."""

import base64
import hashlib
import hmac
import json
import logging
import time
from functools import cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import insert_or_conflict
from service.errors import Conflict, NotFound, Unauthorized
from service.gate.decisions import gate_request
from service.gate.models import Decision
from service.gate.schemas import GateRequest
from service.integrations.mlflow.models import MlflowEvent
from service.jobs.enqueue import queue_job
from service.jobs.models import Job, JobKind
from service.projects.models import Project
from service.projects.scoping import scope_session
from service.projects.service import get_project
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import production_version

ALIAS_SET = ("model_version_alias", "created")
TEST_MODEL = "example_model"  # the registered model of MLflow's test deliveries
CONNECTOR = "mlflow connector"  # who asks, in the decisions and promotions it asks for
LINKS_LEFT_OUT = ("the MLflow connector tags versions without flipgate.report_url while "
                  "FLIPGATE_PUBLIC_URL is unset (a link relative to flipgate means nothing in "
                  "MLflow's UI): set it to the address MLflow's users reach flipgate at")

logger = logging.getLogger(__name__)


def report_link_note(settings: Settings) -> str | None:
    """What `flipgate serve` says at start when the connector is on and cannot link."""
    return LINKS_LEFT_OUT if settings.mlflow_webhook_secret and not settings.public_url else None


@cache
def warn_links_left_out() -> None:
    """Log LINKS_LEFT_OUT, once per process."""
    logger.warning(LINKS_LEFT_OUT)


def check_signature(*, settings: Settings, delivery_id: str | None, timestamp: str | None,
                    signature: str | None, body: bytes) -> None:
    """MLflow's `v1,<base64 HMAC-SHA256 of "{delivery}.{timestamp}.{body}">` under
    FLIPGATE_MLFLOW_WEBHOOK_SECRET, sent within the signature tolerance; 401 otherwise."""
    if settings.mlflow_webhook_secret is None:
        raise NotFound("mlflow_not_configured", "set FLIPGATE_MLFLOW_WEBHOOK_SECRET to receive "
                       "MLflow's webhook")
    if not (delivery_id and timestamp and signature):
        raise Unauthorized("missing_signature", "send X-MLflow-Delivery-Id, "
                           "X-MLflow-Timestamp and X-MLflow-Signature")
    if not timestamp.isdecimal() or abs(time.time() - int(timestamp)) > \
            settings.signature_tolerance_seconds:
        raise Unauthorized("stale_signature", "X-MLflow-Timestamp is not within "
                           f"{settings.signature_tolerance_seconds} s of the server's clock")
    secret = settings.mlflow_webhook_secret.get_secret_value().encode()
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise Unauthorized("invalid_signature", "X-MLflow-Signature does not match the body "
                           "under FLIPGATE_MLFLOW_WEBHOOK_SECRET")


def alias_move(body: bytes, settings: Settings) -> dict[str, str] | None:
    """{model, alias, version} of an event that sets the candidate or promote alias on a
    real model; None for every other event and for MLflow's test delivery."""
    try:
        event = json.loads(body)
        data = event["data"]
        move = {"model": str(data["name"]), "alias": str(data["alias"]),
                "version": str(data["version"])}
    except (ValueError, KeyError, TypeError):
        return None
    watched = (settings.mlflow_candidate_alias, settings.mlflow_promote_alias)
    if (event.get("entity"), event.get("action")) != ALIAS_SET or move["alias"] not in watched \
            or move["model"] == TEST_MODEL:
        return None
    return move


def serve_project(*, session: Session, settings: Settings) -> Project:
    """Bind `session` to the project the connector serves (FLIPGATE_MLFLOW_PROJECT)."""
    project = get_project(session=session, name=settings.mlflow_project)
    scope_session(session, project.id)
    return project


def is_connector_project(*, project: Project, settings: Settings) -> bool:
    """Whether `project` is the one the connector serves: its log is that project's."""
    return project.name == settings.mlflow_project


def receive(*, session: Session, delivery_id: str, move: dict[str, str]) -> Job | None:
    """Log the delivery and queue its job; None when the delivery was received before."""
    try:
        insert_or_conflict(session, MlflowEvent(delivery_id=delivery_id, action="received",
                                                message="", **move),
                           code="delivery_received", message="")
    except Conflict:
        return None
    return queue_alias_job(session=session, move=move)


def queue_alias_job(*, session: Session, move: dict[str, Any],
                    waits_for: list[Job] | tuple = ()) -> Job:
    """The job that acts on an alias move (one open job per move)."""
    return queue_job(session=session, kind=JobKind.MLFLOW, params=move, waits_for=waits_for)


def queue_reconcile(*, session: Session) -> Job:
    """The job that compares MLflow's aliases with flipgate's decisions (one open at a time)."""
    return queue_job(session=session, kind=JobKind.MLFLOW, params={"reconcile": True})


def log_action(*, session: Session, move: dict[str, str], action: str, message: str,
               decision_id: int | None = None) -> MlflowEvent:
    """Append what the connector did to its log."""
    row = MlflowEvent(model=move["model"], alias=move["alias"], version=move["version"],
                      action=action, message=message, decision_id=decision_id)
    session.add(row)
    session.flush()
    return row


def list_events(*, session: Session, model: str, limit: int = 100,
                action: str | None = None) -> list[MlflowEvent]:
    """The connector's log on a registered model (its lines of one `action`), newest first;
    read by the project the connector serves."""
    statement = select(MlflowEvent).where(MlflowEvent.model == model)
    if action is not None:
        statement = statement.where(MlflowEvent.action == action)
    return list(session.scalars(statement.order_by(MlflowEvent.id.desc()).limit(limit)))


def gate_version(*, session: Session, settings: Settings, candidate: ModelVersion) -> Decision:
    """The gate's decision on `candidate` against production under the line's policy; asked
    again (a job run twice), the same delivery answers the same decision."""
    line = session.get_one(ModelLine, candidate.line_id)
    production = production_version(session=session, line=line)
    baseline = production.version if production else "none"
    return gate_request(session=session, settings=settings,
                        request=GateRequest(model=line.name, candidate=candidate.version),
                        requested_by=CONNECTOR, base_url=settings.link_base,
                        delivery_id=f"mlflow:{candidate.version}:vs:{baseline}")
