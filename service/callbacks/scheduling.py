"""When a callback is sent: queued with its decision's final verdict (sent after the commit),
sent again by the worker's sweeper while it is due, and given up after the attempts allowed;
each attempt recorded on its row."""

from datetime import timedelta

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session

from service.callbacks.models import Callback, CallbackState
from service.celery_app import CALLBACK_TASK
from service.config import Settings
from service.db import utcnow
from service.outbox import send_task_after_commit

CALLBACK_RESEND_SECONDS = 60  # a queued callback not attempted by then is sent again


def queue_callback(*, session: Session, decision_id: int) -> Callback:
    """The callback of a decision that became final, sent after the commit (and by the
    worker's sweeper if it is still queued CALLBACK_RESEND_SECONDS later)."""
    callback = Callback(decision_id=decision_id,
                        due_at=utcnow() + timedelta(seconds=CALLBACK_RESEND_SECONDS))
    session.add(callback)
    send_task_after_commit(session=session, task=CALLBACK_TASK, argument=decision_id)
    return callback


def queued_callback(*, session: Session, decision_id: int) -> Callback | None:
    """The decision's callback, locked, while it still waits to be delivered."""
    statement = select(Callback).where(Callback.decision_id == decision_id).with_for_update()
    callback = session.scalars(statement).one_or_none()
    return callback if callback is not None and callback.state == CallbackState.QUEUED else None


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


def send_due(*, session: Session, resend_seconds: float) -> list[int]:
    """Send again, after the commit, the callbacks that are due (`due_callbacks`)."""
    due = due_callbacks(session=session, resend_seconds=resend_seconds)
    for decision_id in due:
        send_task_after_commit(session=session, task=CALLBACK_TASK, argument=decision_id)
    return due
