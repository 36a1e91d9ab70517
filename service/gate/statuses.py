"""A final decision's status as its callback POSTs it (shaped like a GitHub commit status),
and all that the callback's delivery (service.callbacks.delivery) needs from the decision."""

import json
from typing import Any

from sqlalchemy.orm import Session

from service.callbacks.delivery import Status
from service.callbacks.scheduling import queued_callback
from service.callbacks.targets import full_callback_url
from service.config import Settings
from service.gate.decisions import get_decision
from service.gate.models import Decision, Verdict
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


def delivery(*, session: Session, settings: Settings,
             decision_id: int) -> tuple[str | None, dict[str, Any], str | None]:
    """The URL (None when no server key opens it), body and signing secret (the line's
    webhook secret, if any) of a callback."""
    decision = get_decision(session=session, decision_id=decision_id)
    line = session.get_one(ModelLine, decision.line_id)
    return (full_callback_url(settings, decision.callback_url, decision.callback_url_sealed),
            callback_body(session=session, decision=decision),
            signing_secret(session=session, settings=settings, line_name=line.name))


def queued_status(*, session: Session, settings: Settings, decision_id: int) -> Status | None:
    """The status to POST for the decision while its callback is still queued (its row
    locked until the session ends); None once it was delivered or given up."""
    if queued_callback(session=session, decision_id=decision_id) is None:
        return None
    url, body, secret = delivery(session=session, settings=settings, decision_id=decision_id)
    request_id = session.get_one(Decision, decision_id).request_id  # loaded: no query
    return Status(decision_id=decision_id, url=url, body=json.dumps(body).encode(),
                  secret=secret, request_id=request_id)
