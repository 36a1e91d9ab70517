"""Making a decision final: its verdict, reasons and metrics, and the callback it queues."""

from typing import Any

from sqlalchemy.orm import Session

from service.callbacks.scheduling import queue_callback
from service.db import utcnow
from service.gate.models import Decision, Verdict


def finalize(*, session: Session, decision: Decision, verdict: Verdict, reasons: list[dict],
             metrics: dict[str, Any] | None = None) -> None:
    """Record the final verdict; its callback, if any, is queued (service.callbacks.scheduling)."""
    decision.verdict, decision.reasons, decision.metrics = verdict, reasons, metrics or {}
    decision.decided_at = utcnow()
    if decision.callback_url is not None:
        queue_callback(session=session, decision_id=decision.id)
    session.flush()


def note(code: str, message: str, *, blocking: bool = False) -> dict[str, Any]:
    """A reason that is not a measured limit."""
    return {"code": code, "blocking": blocking, "message": message}


def decide(*, session: Session, decision: Decision, verdict: Verdict, reasons: list[dict],
           metrics: dict[str, Any]) -> None:
    """Record a checked verdict: final, or, when a traffic set needs labels, still pending
    with its reasons and metrics (how many labels are needed); no callback until final."""
    if verdict != Verdict.PENDING:
        return finalize(session=session, decision=decision, verdict=verdict, reasons=reasons,
                        metrics=metrics)
    decision.reasons, decision.metrics = reasons, metrics
    session.flush()
