"""Sending tasks to the broker only once the rows they name are committed.

Every job that `create_job` adds (and every task `send_task_after_commit` asks for) is
remembered on its session; a session handed to `enqueue_after_commit` sends them after its
transaction commits and forgets them on rollback, so a worker never receives the id of a row
it cannot see yet.
"""

import logging

from celery import Celery
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.jobs.service import TASKS_TO_SEND

SENDER = "flipgate.celery"
logger = logging.getLogger(__name__)


def enqueue_after_commit(*, session: Session, celery: Celery) -> None:
    """Send the tasks of the jobs this session creates through `celery` after each commit."""
    session.info[SENDER] = celery
    if not event.contains(session, "after_commit", _send_created):
        event.listen(session, "after_commit", _send_created)
        event.listen(session, "after_rollback", _forget_created)


def _send_created(session: Session) -> None:
    """After a commit: the tasks the transaction asked for."""
    tasks, celery = session.info.pop(TASKS_TO_SEND, []), session.info[SENDER]
    for task_name, argument in tasks:
        _send(celery, task_name, argument)


def _send(celery: Celery, task_name: str, argument: int) -> None:
    """Send one task; a broker failure leaves the committed row as it is and is logged."""
    try:
        celery.send_task(task_name, args=[argument])
    except Exception:  # the row is committed; a worker or a later request can still pick it up
        logger.exception("could not send %s(%s) to the broker", task_name, argument)


def _forget_created(session: Session) -> None:
    session.info.pop(TASKS_TO_SEND, None)
