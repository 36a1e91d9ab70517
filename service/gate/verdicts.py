"""Giving a decision its verdict, reasons and metrics, and the callback a final one queues."""

from typing import Any

from sqlalchemy.orm import Session

from service.callbacks.scheduling import queue_callback
from service.db import utcnow
from service.gate.models import Decision, Verdict


def judge(decision: Decision, *, verdict: Verdict, reasons: list[dict],
          metrics: dict[str, Any] | None = None) -> None:
    """Give the decision a verdict: final, decided now, unless it is pending (a traffic set
    that needs labels: its reasons and metrics say how many); nothing is written yet."""
    decision.verdict, decision.reasons, decision.metrics = verdict, reasons, metrics or {}
    if verdict != Verdict.PENDING:
        decision.decided_at = utcnow()


def announce(*, session: Session, decision: Decision) -> None:
    """Queue the callback of a stored decision that is final, if it has one
    (service.callbacks.scheduling)."""
    if decision.verdict != Verdict.PENDING and decision.callback_url is not None:
        queue_callback(session=session, decision_id=decision.id)
    session.flush()


def note(code: str, message: str, *, blocking: bool = False) -> dict[str, Any]:
    """A reason that is not a measured limit."""
    return {"code": code, "blocking": blocking, "message": message}


def decide(*, session: Session, decision: Decision, verdict: Verdict, reasons: list[dict],
           metrics: dict[str, Any] | None = None) -> None:
    """Record a verdict on a stored decision (see judge); a final one's callback is queued,
    a pending one's waits until it is final."""
    judge(decision, verdict=verdict, reasons=reasons, metrics=metrics)
    announce(session=session, decision=decision)
