"""Sending the tasks of new jobs to the broker only once their rows are committed.

Every job that `create_job` adds is remembered on its session; a session handed to
`enqueue_after_commit` sends one task per such job after its transaction commits and forgets
them on rollback, so a worker never receives the id of a row it cannot see yet.
"""

import logging

from celery import Celery
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.jobs.models import JobKind
from service.jobs.service import CREATED_JOBS

TASK_NAMES = {JobKind.INFERENCE: "flipgate.inference", JobKind.METRICS: "flipgate.metrics"}
SENDER = "flipgate.celery"
logger = logging.getLogger(__name__)


def enqueue_after_commit(*, session: Session, celery: Celery) -> None:
    """Send the tasks of the jobs this session creates through `celery` after each commit."""
    session.info[SENDER] = celery
    if not event.contains(session, "after_commit", _send_created):
        event.listen(session, "after_commit", _send_created)
        event.listen(session, "after_rollback", _forget_created)


def _send_created(session: Session) -> None:
    """After a commit: one task per job the transaction created, by its task name."""
    created, celery = session.info.pop(CREATED_JOBS, []), session.info[SENDER]
    for kind, job_id in created:
        if kind in TASK_NAMES:
            _send(celery, TASK_NAMES[kind], job_id)


def _send(celery: Celery, task_name: str, job_id: int) -> None:
    """Send one job's task; a broker failure leaves the committed job queued and is logged."""
    try:
        celery.send_task(task_name, args=[job_id])
    except Exception:  # the row is committed; a worker or a later request can still pick it up
        logger.exception("could not send job %s (%s) to the broker", job_id, task_name)


def _forget_created(session: Session) -> None:
    session.info.pop(CREATED_JOBS, None)
