"""Queueing jobs: the one place a job row is created with the jobs it waits for, and its task
asked for (service.jobs.models.JOB_TASKS names it).

A job is sent once nothing it waits for (job_dependencies) is open: at once when it is created
ready, else by `release_waiting` when the last job it waits for succeeds (service.flows calls
it). Sending happens after the commit (service.outbox), so a worker never receives the id of a
row it cannot see yet. The broker's acceptance is recorded on the job row (sent_at, by the
outbox's `on_sent` hook); `send_unsent` sends what it has not accepted (service.jobs.leases:
the row is the message).
"""

from collections.abc import Sequence
from typing import Any

from celery import Celery
from sqlalchemy.orm import Session

from service.jobs.leases import mark_sent, unsent_jobs
from service.jobs.models import JOB_TASKS, Job, JobDependency, JobKind, JobState
from service.jobs.service import (
    OPEN_STATES,
    dependencies,
    find_open_job,
    list_shards,
    mark_finished,
    waiting_for,
)
from service.observability.origin import job_reused
from service.outbox import send_now, send_task_after_commit
from service.projects.scoping import session_project


def queue_job(*, session: Session, kind: JobKind, params: dict[str, Any],
              waits_for: Sequence[Job] = ()) -> Job:
    """The open (queued or running) job of this kind with these params, else a new one that
    waits for `waits_for`."""
    found = find_open_job(session=session, kind=kind, params=params)
    if found is None:
        return create_job(session=session, kind=kind, params=params, waits_for=waits_for)
    job_reused(found)
    return found


def create_job(*, session: Session, kind: JobKind, params: dict[str, Any],
               parent: Job | None = None, waits_for: Sequence[Job] = ()) -> Job:
    """A new queued job (a shard when `parent` is given), sent after the commit once the jobs
    it waits for have succeeded; cancelled at once if one of them has already failed. It
    belongs to its parent's project, else to the one `session` is bound to."""
    job = Job(kind=kind, params=params, parent=parent, project_id=_project_of(session, parent))
    session.add(job)
    session.flush()
    session.add_all(JobDependency(job_id=job.id, waits_for_id=other.id) for other in waits_for)
    session.flush()
    if waits_for:
        _send_or_cancel(session, job)
    else:
        send_after_commit(session=session, job=job)
    return job


def _project_of(session: Session, parent: Job | None) -> int:
    """The project of a new job: its parent's, else its session's (ValueError if unbound:
    the sweeper and the CLI bind theirs before they create a job)."""
    project_id = parent.project_id if parent is not None else session_project(session)
    if project_id is None:
        raise ValueError("a job is created in a session bound to a project (scope_session)")
    return project_id


def split_job(*, session: Session, job: Job, samples: int, shard_size: int) -> list[Job]:
    """Queue the shards of a running job over `samples` samples, `shard_size` each (the last
    one what is left), with the job's params and their range [start, stop); once: a job
    delivered again keeps the shards it has."""
    return list_shards(session=session, job=job) or [
        create_job(session=session, kind=job.kind, parent=job,
                   params={**job.params, "parent_id": job.id, "start": start,
                           "stop": min(start + shard_size, samples)})
        for start in range(0, samples, shard_size)]


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
        mark_finished(session=session, job=job, state=JobState.CANCELLED,
                      error=f"job {other.id}, which it waited for, {other.state}")
    elif all(other.state == JobState.SUCCEEDED for other in others):
        send_after_commit(session=session, job=job)


def _ready(session: Session, job: Job) -> bool:
    """Whether every job `job` waits for has succeeded."""
    return all(other.state == JobState.SUCCEEDED
               for other in dependencies(session=session, job=job))


def send_after_commit(*, session: Session, job: Job) -> None:
    """Have the task of a queued job sent once the session commits; the row is marked sent
    when the broker accepts it."""
    send_task_after_commit(session=session, task=JOB_TASKS[job.kind], argument=job.id,
                           on_sent=_mark_sent)


def _mark_sent(session: Session, job_ids: list[int]) -> None:
    """The outbox's hook: the broker accepted the tasks of these jobs."""
    mark_sent(session=session, job_ids=job_ids)


def send_unsent(*, session: Session, celery: Celery, resend_seconds: float) -> list[int]:
    """Send the ready queued jobs the broker has not accepted (or accepted more than
    `resend_seconds` ago) and mark them sent; stops at the first broker failure. The ids sent."""
    sent = []
    for job in unsent_jobs(session=session, resend_seconds=resend_seconds):
        if not send_now(celery, JOB_TASKS[job.kind], job.id):
            break
        sent.append(job.id)
    mark_sent(session=session, job_ids=sent)
    return sent
