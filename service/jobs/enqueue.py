"""Queueing jobs: the one place a job row is created with the jobs it waits for, and its task
sent to the broker (service.queue names the tasks and configures Celery).

A job is sent once nothing it waits for (job_dependencies) is open: at once when it is created
ready, else by `release_waiting` when the last job it waits for succeeds (service.flows calls
it). Sending happens after the commit: every task a session asks for is remembered on it, and
a session handed to `enqueue_after_commit` sends them after its transaction commits and forgets
them on rollback, so a worker never receives the id of a row it cannot see yet. The broker's
acceptance is recorded on the job row (sent_at); `send_unsent` sends what it has not accepted
(service.jobs.leases: the row is the message).
"""

import logging
from collections.abc import Sequence
from typing import Any

from celery import Celery
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.jobs.leases import mark_sent, unsent_jobs
from service.jobs.models import Job, JobDependency, JobKind, JobState
from service.jobs.service import (
    OPEN_STATES,
    dependencies,
    find_open_job,
    finish_job,
    waiting_for,
)
from service.queue import JOB_TASKS

SENDER = "flipgate.celery"
TASKS_TO_SEND = "flipgate.tasks_to_send"  # session.info key: (task name, argument) pairs
logger = logging.getLogger(__name__)


def queue_job(*, session: Session, kind: JobKind, params: dict[str, Any],
              waits_for: Sequence[Job] = ()) -> Job:
    """The open (queued or running) job of this kind with these params, else a new one that
    waits for `waits_for`."""
    return (find_open_job(session=session, kind=kind, params=params)
            or create_job(session=session, kind=kind, params=params, waits_for=waits_for))


def create_job(*, session: Session, kind: JobKind, params: dict[str, Any],
               parent: Job | None = None, waits_for: Sequence[Job] = ()) -> Job:
    """A new queued job (a shard when `parent` is given), sent after the commit once the jobs
    it waits for have succeeded; cancelled at once if one of them has already failed."""
    job = Job(kind=kind, params=params, parent=parent)
    session.add(job)
    session.flush()
    session.add_all(JobDependency(job_id=job.id, waits_for_id=other.id) for other in waits_for)
    session.flush()
    if waits_for:
        _send_or_cancel(session, job)
    else:
        send_after_commit(session=session, job=job)
    return job


def create_shards(*, session: Session, job: Job, ranges: list[tuple[int, int]]) -> list[Job]:
    """Queue one shard of `job` per sample range [start, stop), with the job's params."""
    return [create_job(session=session, kind=job.kind, parent=job,
                       params={**job.params, "parent_id": job.id, "start": start, "stop": stop})
            for start, stop in ranges]


def release_waiting(*, session: Session, job: Job) -> list[Job]:
    """After `job` succeeded: the jobs waiting for it whose dependencies have all succeeded
    now, sent after the commit."""
    released = [waiting for waiting in waiting_for(session=session, job=job)
                if _ready(session, waiting)]
    for waiting in released:
        send_after_commit(session=session, job=waiting)
    return released


def _send_or_cancel(session: Session, job: Job) -> None:
    """Send a new job whose dependencies (locked, so that one ending meanwhile commits first)
    have all succeeded; cancel it if one failed; else leave it to `release_waiting`."""
    others = dependencies(session=session, job=job, lock=True)
    ended_badly = [other for other in others if other.state not in {*OPEN_STATES,
                                                                    JobState.SUCCEEDED}]
    if ended_badly:
        other = ended_badly[0]
        finish_job(session=session, job=job, state=JobState.CANCELLED,
                   error=f"job {other.id}, which it waited for, {other.state}")
    elif all(other.state == JobState.SUCCEEDED for other in others):
        send_after_commit(session=session, job=job)


def _ready(session: Session, job: Job) -> bool:
    """Whether every job `job` waits for has succeeded."""
    return all(other.state == JobState.SUCCEEDED
               for other in dependencies(session=session, job=job))


def send_after_commit(*, session: Session, job: Job) -> None:
    """Have the task of a queued job sent once the session commits."""
    send_task_after_commit(session=session, task=JOB_TASKS[job.kind], argument=job.id)


def send_task_after_commit(*, session: Session, task: str, argument: int) -> None:
    """Have the Celery task `task` sent with one argument once the session commits."""
    session.info.setdefault(TASKS_TO_SEND, []).append((task, argument))


def enqueue_after_commit(*, session: Session, celery: Celery) -> None:
    """Send the tasks this session asks for through `celery` after each commit."""
    session.info[SENDER] = celery
    if not event.contains(session, "after_commit", _send_asked):
        event.listen(session, "after_commit", _send_asked)
        event.listen(session, "after_rollback", _forget_asked)


def _send_asked(session: Session) -> None:
    """After a commit: the tasks the transaction asked for; the jobs the broker accepted are
    marked sent in a transaction of their own (a session bound to a connection, not an
    engine, leaves them unmarked: the sweeper sends them once more, which is harmless). A
    savepoint's release fires after_commit too: its tasks wait for the real commit. The
    first send the broker refuses (or does not answer) ends the sending: the sweeper sends
    the rest, so a request waits on an unanswering broker once at most."""
    if session.in_nested_transaction():
        return
    tasks, celery = session.info.pop(TASKS_TO_SEND, []), session.info[SENDER]
    sent_jobs = []
    for task_name, argument in tasks:
        if not _send(celery, task_name, argument):
            break
        if task_name in JOB_TASKS.values():
            sent_jobs.append(argument)
    bind = session.get_bind()
    if sent_jobs and isinstance(bind, Engine):
        with session_scope(sessionmaker(bind)) as marking:
            mark_sent(session=marking, job_ids=sent_jobs)


def _send(celery: Celery, task_name: str, argument: int) -> bool:
    """Send one task; whether the broker accepted it. A broker failure leaves the committed
    row queued and unsent, for `send_unsent`, and is logged."""
    try:
        celery.send_task(task_name, args=[argument])
    except Exception:  # the row is committed and stays unsent: the dispatcher sends it later
        logger.exception("could not send %s(%s) to the broker", task_name, argument)
        return False
    return True


def send_unsent(*, session: Session, celery: Celery, resend_seconds: float) -> list[int]:
    """Send the ready queued jobs the broker has not accepted (or accepted more than
    `resend_seconds` ago) and mark them sent; stops at the first broker failure. The ids sent."""
    sent = []
    for job in unsent_jobs(session=session, resend_seconds=resend_seconds):
        if not _send(celery, JOB_TASKS[job.kind], job.id):
            break
        sent.append(job.id)
    mark_sent(session=session, job_ids=sent)
    return sent


def _forget_asked(session: Session) -> None:
    session.info.pop(TASKS_TO_SEND, None)
