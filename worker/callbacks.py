"""The callback task: one attempt to POST a final decision's status (service.callbacks.delivery);
a failure is retried from its row, which the worker's sweeper sends when it is due."""

from service.callbacks.delivery import attempt
from service.celery_app import CALLBACK_TASK
from service.db import session_scope
from service.gate.statuses import queued_status
from service.observability.context import request_id_bound
from worker.app import app
from worker.runtime import context


@app.task(name=CALLBACK_TASK)
def deliver_callback(decision_id: int) -> None:
    """POST the status once, if the callback is still queued, under the id of the request
    that asked for the decision (its log lines and its X-Request-ID carry it)."""
    ctx = context()
    with session_scope(ctx.sessions) as session:
        status = queued_status(session=session, settings=ctx.settings, decision_id=decision_id)
    if status is None:
        return
    with request_id_bound(status.request_id):
        attempt(sessions=ctx.sessions, settings=ctx.settings, status=status)
