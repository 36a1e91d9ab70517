"""Making a decision final: its verdict, reasons and metrics, and the callback it queues."""

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.db import utcnow
from service.gate.models import Callback, Decision, Verdict
from service.outbox import send_task_after_commit
from service.queue import CALLBACK_TASK

CALLBACK_RESEND_SECONDS = 60  # a queued callback not attempted by then is sent again


def finalize(*, session: Session, decision: Decision, verdict: Verdict, reasons: list[dict],
             metrics: dict[str, Any] | None = None) -> None:
    """Record the final verdict; its callback, if any, is sent after the commit (and by the
    worker's sweeper if it is still queued CALLBACK_RESEND_SECONDS later)."""
    decision.verdict, decision.reasons, decision.metrics = verdict, reasons, metrics or {}
    decision.decided_at = utcnow()
    if decision.callback_url is not None:
        session.add(Callback(decision_id=decision.id,
                             due_at=utcnow() + timedelta(seconds=CALLBACK_RESEND_SECONDS)))
        send_task_after_commit(session=session, task=CALLBACK_TASK, argument=decision.id)
    session.flush()


def note(code: str, message: str, *, blocking: bool = False) -> dict[str, Any]:
    """A reason that is not a measured limit."""
    return {"code": code, "blocking": blocking, "message": message}
