"""The status a final decision POSTs to its callback URL, shaped like a GitHub commit status,
and the record of each delivery attempt."""

from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import utcnow
from service.gate.decisions import get_decision
from service.gate.models import Callback, CallbackState, Decision, Verdict
from service.gate.outbound import full_callback_url
from service.gate.views import decision_view
from service.gate.webhook_secrets import signing_secret
from service.registry.models import ModelLine

STATES = {Verdict.APPROVE: "success", Verdict.BLOCK: "failure", Verdict.PENDING: "pending"}
DESCRIPTION_LENGTH = 140  # GitHub's limit


def callback_body(*, session: Session, decision: Decision) -> dict[str, Any]:
    """{state, description, target_url, context} of a final decision (GitHub's status API);
    without FLIPGATE_PUBLIC_URL the report's link is relative, and is left out."""
    view = decision_view(session=session, decision=decision)
    failed = any(reason["code"] == "measurement_failed" for reason in view.reasons)
    blocking = [reason["message"] for reason in view.reasons if reason["blocking"]]
    summary = (f"flipgate {view.verdict}s {view.model}:{view.candidate}"
               + ("" if view.baseline is None else f" over {view.baseline}")
               + (f": {blocking[0]}" if blocking else ""))
    body = {"state": "error" if failed else STATES[view.verdict],
            "description": summary[:DESCRIPTION_LENGTH], "context": f"flipgate/{view.model}"}
    if view.report_url and view.report_url.startswith(("https://", "http://")):
        body["target_url"] = view.report_url
    return body


def queued_callback(*, session: Session, decision_id: int) -> Callback | None:
    """The decision's callback, locked, while it still waits to be delivered."""
    statement = select(Callback).where(Callback.decision_id == decision_id).with_for_update()
    callback = session.scalars(statement).one_or_none()
    return callback if callback is not None and callback.state == CallbackState.QUEUED else None


def delivery(*, session: Session, settings: Settings,
             decision_id: int) -> tuple[str | None, dict[str, Any], str | None]:
    """The URL (None when no server key opens it), body and signing secret (the line's
    webhook secret, if any) of a callback."""
    decision = get_decision(session=session, decision_id=decision_id)
    line = session.get_one(ModelLine, decision.line_id)
    return (full_callback_url(settings, decision),
            callback_body(session=session, decision=decision),
            signing_secret(session=session, settings=settings, line_name=line.name))


def record_attempt(*, callback: Callback, status: int | None, error: str | None,
                   settings: Settings) -> Callback:
    """Count one delivery attempt: a 2xx status delivers it; the last failure gives up; any
    other failure is due again after a delay that doubles with each attempt."""
    callback.attempts += 1
    callback.last_status, callback.last_error = status, error
    if status is not None and 200 <= status < 300:
        callback.state, callback.delivered_at = CallbackState.DELIVERED, utcnow()
    elif callback.attempts >= settings.callback_attempts:
        callback.state = CallbackState.FAILED
    else:
        delay = settings.callback_backoff_seconds * 2 ** (callback.attempts - 1)
        callback.due_at = utcnow() + timedelta(seconds=delay)
    return callback


def due_now() -> ColumnElement[bool]:
    """The condition of a queued callback that is due now."""
    return and_(Callback.state == CallbackState.QUEUED, Callback.due_at <= utcnow())


def due_callbacks(*, session: Session, resend_seconds: float) -> list[int]:
    """The decisions whose queued callback is due, locked; each is due again
    `resend_seconds` later unless an attempt is recorded before."""
    statement = select(Callback).where(due_now())
    due = list(session.scalars(statement.order_by(Callback.id).with_for_update(
        skip_locked=True)))
    for callback in due:
        callback.due_at = utcnow() + timedelta(seconds=resend_seconds)
    return [callback.decision_id for callback in due]
