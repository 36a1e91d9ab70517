"""Making a decision final: its verdict, reasons and metrics, and the callback it queues."""

from typing import Any

from sqlalchemy.orm import Session

from service.db import utcnow
from service.gate.models import Callback, Decision, Verdict
from service.jobs.enqueue import send_task_after_commit
from service.queue import CALLBACK_TASK


def finalize(*, session: Session, decision: Decision, verdict: Verdict, reasons: list[dict],
             metrics: dict[str, Any] | None = None) -> None:
    """Record the final verdict; its callback, if any, is sent after the commit."""
    decision.verdict, decision.reasons, decision.metrics = verdict, reasons, metrics or {}
    decision.decided_at = utcnow()
    if decision.callback_url is not None:
        session.add(Callback(decision_id=decision.id))
        send_task_after_commit(session=session, task=CALLBACK_TASK, argument=decision.id)
    session.flush()


def note(code: str, message: str, *, blocking: bool = False) -> dict[str, Any]:
    """A reason that is not a measured limit."""
    return {"code": code, "blocking": blocking, "message": message}
