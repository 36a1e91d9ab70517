"""Sending Celery tasks after the commit: the infrastructure every domain's "enqueue" rides.

A domain asks for a task with `send_task_after_commit`; the ask is remembered on the session,
and a session handed to `enqueue_after_commit` sends what it asked for after its transaction
commits and forgets it on rollback, so a worker never receives the id of a row it cannot see
yet. An ask may carry an `on_sent` hook: the arguments the broker accepted are handed to it in
a transaction of its own (the jobs domain marks its rows sent; a row not marked is sent again
by the worker's sweeper). This module knows no domain.
"""

import logging
from collections.abc import Callable

from celery import Celery
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope

SENDER = "flipgate.celery"
TASKS_TO_SEND = "flipgate.tasks_to_send"  # session.info key: (task, argument, on_sent) asks
OnSent = Callable[[Session, list[int]], None]  # (a session of its own, the arguments sent)
logger = logging.getLogger(__name__)


def send_task_after_commit(*, session: Session, task: str, argument: int,
                           on_sent: OnSent | None = None) -> None:
    """Have the Celery task `task` sent with one argument once the session commits; the
    arguments the broker accepted go to `on_sent`, if given."""
    session.info.setdefault(TASKS_TO_SEND, []).append((task, argument, on_sent))


def enqueue_after_commit(*, session: Session, celery: Celery) -> None:
    """Send the tasks this session asks for through `celery` after each commit (the
    listeners are the Session class's: a request's session costs no listener of its own)."""
    session.info[SENDER] = celery


@event.listens_for(Session, "after_commit")
def _send_asked(session: Session) -> None:
    """After a commit: the tasks the transaction asked for; the arguments the broker accepted
    go to their `on_sent` hooks in a transaction of their own (a session bound to a
    connection, not an engine, calls none: the sweeper sends them once more, which is
    harmless). A savepoint's release fires after_commit too: its tasks wait for the real
    commit. The first send the broker refuses (or does not answer) ends the sending: the
    sweeper sends the rest, so a request waits on an unanswering broker once at most."""
    celery = session.info.get(SENDER)
    if celery is None or TASKS_TO_SEND not in session.info or session.in_nested_transaction():
        return
    asks = session.info.pop(TASKS_TO_SEND)
    accepted: dict[OnSent, list[int]] = {}
    for task, argument, on_sent in asks:
        if not send_now(celery, task, argument):
            break
        if on_sent is not None:
            accepted.setdefault(on_sent, []).append(argument)
    bind = session.get_bind()
    if accepted and isinstance(bind, Engine):
        with session_scope(sessionmaker(bind)) as recording:
            for on_sent, arguments in accepted.items():
                on_sent(recording, arguments)


def send_now(celery: Celery, task: str, argument: int) -> bool:
    """Send one task; whether the broker accepted it. A broker failure is logged: the row
    that asked for the task is committed and is sent again later (the worker's sweeper)."""
    try:
        celery.send_task(task, args=[argument])
    except Exception:  # the row is committed and stays unsent: the sweeper sends it later
        logger.exception("could not send %s(%s) to the broker", task, argument)
        return False
    return True


@event.listens_for(Session, "after_rollback")
def _forget_asked(session: Session) -> None:
    session.info.pop(TASKS_TO_SEND, None)
