"""The callback task: one attempt to POST a final decision's status (service.callbacks.delivery);
a failure is retried from its row, which the worker's sweeper sends when it is due."""

from service.callbacks.delivery import deliver
from service.celery_app import CALLBACK_TASK
from worker.app import app
from worker.runtime import context


@app.task(name=CALLBACK_TASK)
def deliver_callback(decision_id: int) -> None:
    """POST the status once (service.callbacks.delivery.deliver)."""
    ctx = context()
    deliver(sessions=ctx.sessions, settings=ctx.settings, decision_id=decision_id)
