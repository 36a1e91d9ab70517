"""Moving jobs through their states, and reading them with their shards and dependencies.

Creating and sending jobs is service.jobs.enqueue (over service.outbox); what follows a job's
end is service.flows."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from service.db import one_or_not_found, utcnow
from service.errors import Conflict, InvalidInput
from service.jobs.models import Job, JobDependency, JobKind, JobState

NEXT_STATES = {
    JobState.QUEUED: {JobState.RUNNING, JobState.CANCELLED},
    JobState.RUNNING: {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                       JobState.QUEUED},  # queued again: its worker was lost
}
FINAL_STATES = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
OPEN_STATES = {JobState.QUEUED, JobState.RUNNING}


def list_shards(*, session: Session, job: Job) -> list[Job]:
    """The shards of a job in the order they were created (their sample ranges' order)."""
    return list(session.scalars(select(Job).where(Job.parent_id == job.id).order_by(Job.id)))


def last_shard_parts(*, session: Session, shard_id: int, part: str,
                     key: str) -> tuple[Job, list[str]] | None:
    """When shard `shard_id`, ending now with `part`, is the last of its parent's shards to
    end: the parent and every shard's part in order (the others' under `key` in their
    results), to be merged into the parent's output. None while another shard is open."""
    parent = get_job(session=session, job_id=get_job(session=session, job_id=shard_id).parent_id)
    shards = list_shards(session=session, job=parent)
    if any(other.id != shard_id and other.state != JobState.SUCCEEDED for other in shards):
        return None
    return parent, [part if other.id == shard_id else other.result[key] for other in shards]


def find_open_job(*, session: Session, kind: JobKind, params: dict[str, Any],
                  states: Sequence[JobState] = OPEN_STATES) -> Job | None:
    """The oldest job of this kind with exactly these params in one of `states` (by default
    queued or running)."""
    statement = select(Job).where(Job.kind == kind, Job.state.in_(states)).order_by(Job.id)
    return next((job for job in session.scalars(statement) if job.params == params), None)


def waiting_for(*, session: Session, job: Job) -> list[Job]:
    """The queued jobs that wait for `job` (job_dependencies), locked."""
    waiting = select(JobDependency.job_id).where(JobDependency.waits_for_id == job.id)
    return _lock_all(session, select(Job).where(Job.id.in_(waiting),
                                                Job.state == JobState.QUEUED))


def dependencies(*, session: Session, job: Job, lock: bool = False) -> list[Job]:
    """The jobs `job` waits for, oldest first (`lock`: locked, in that order)."""
    statement = select(Job).where(Job.id.in_(
        select(JobDependency.waits_for_id).where(JobDependency.job_id == job.id)))
    if lock:
        return _lock_all(session, statement)
    return list(session.scalars(statement.order_by(Job.id)))


def _lock_all(session: Session, statement: Select[tuple[Job]]) -> list[Job]:
    """The jobs `statement` selects, locked in id order and read afresh."""
    return list(session.scalars(statement.order_by(Job.id).with_for_update()
                                .execution_options(populate_existing=True)))


def get_job(*, session: Session, job_id: int) -> Job:
    """The job with this id."""
    return one_or_not_found(session, select(Job).where(Job.id == job_id),
                            code="job_not_found", message=f"no job {job_id}")


def claim_job(*, session: Session, job_id: int) -> Job | None:
    """Lock a queued job and start it; None when it is unknown, ended, or running already (a
    message delivered twice; a lost worker's job is queued again by the reaper)."""
    job = _locked(session, job_id)
    if job is None or job.state != JobState.QUEUED:
        return None
    return start_job(session=session, job=job)


def lock_running_job(*, session: Session, job_id: int) -> Job | None:
    """The job, locked until the transaction ends, while it is running; else None."""
    job = _locked(session, job_id)
    return job if job is not None and job.state == JobState.RUNNING else None


def _locked(session: Session, job_id: int) -> Job | None:
    """The job locked for update, its parent locked first (one lock order: no deadlocks)."""
    parent_id = session.scalar(select(Job.parent_id).where(Job.id == job_id))
    if parent_id is not None:
        _lock(session, parent_id)
    return _lock(session, job_id)


def _lock(session: Session, job_id: int) -> Job | None:
    statement = select(Job).where(Job.id == job_id).with_for_update()
    return session.scalars(statement.execution_options(populate_existing=True)).one_or_none()


def start_job(*, session: Session, job: Job) -> Job:
    """Mark a queued job as running: one more attempt, its lease renewed now."""
    _move(job, JobState.RUNNING)
    job.started_at = job.heartbeat_at = utcnow()
    job.attempts += 1
    session.flush()
    return job


def set_progress(*, session: Session, job: Job, progress: float) -> Job:
    """Record how far a running job has come, between 0 and 1."""
    if not 0.0 <= progress <= 1.0:
        raise InvalidInput("invalid_progress", f"progress must lie in [0, 1], not {progress}")
    if job.state != JobState.RUNNING:
        raise Conflict("job_not_running", f"job {job.id} is {job.state}, not running")
    job.progress = progress
    session.flush()
    if job.parent_id is not None:
        parent = session.get_one(Job, job.parent_id)
        parent.progress = session.scalar(select(func.avg(Job.progress))
                                         .where(Job.parent_id == parent.id))
        session.flush()
    return job


def mark_finished(*, session: Session, job: Job, state: JobState,
                  result: dict[str, Any] | None = None, error: str | None = None) -> Job:
    """Move a job to its end as succeeded (with its result), failed (with an error) or
    cancelled, with its family (the state change only: ending a job is flows.finish_job)."""
    if state not in FINAL_STATES:
        raise InvalidInput("invalid_state", f"{state} is not a final job state")
    _move(job, state)
    job.result, job.error, job.finished_at = result, error, utcnow()
    if state == JobState.SUCCEEDED:
        job.progress = 1.0
    session.flush()
    if state != JobState.SUCCEEDED:
        _end_family(session, job)
    return job


def _end_family(session: Session, job: Job) -> None:
    """After a job failed or was cancelled: its open shards are cancelled, and the open
    parent of a shard fails, and the jobs waiting for it are cancelled."""
    open_shards = select(Job).where(Job.parent_id == job.id, Job.state.in_(OPEN_STATES))
    for shard in session.scalars(open_shards.order_by(Job.id)).all():
        mark_finished(session=session, job=shard, state=JobState.CANCELLED)
    parent = None if job.parent_id is None else session.get_one(Job, job.parent_id)
    reason = f"{job.state}: {job.error or 'no error recorded'}"
    if parent is not None and parent.state in OPEN_STATES:
        mark_finished(session=session, job=parent, state=JobState.FAILED,
                      error=f"shard {job.id} {reason}")
    for waiting in waiting_for(session=session, job=job):
        mark_finished(session=session, job=waiting, state=JobState.CANCELLED,
                      error=f"job {job.id}, which it waited for, {reason}")


def mark_cancelled(*, session: Session, job_id: int) -> Job:
    """Move a queued or running job and its shards to cancelled (the state change only:
    cancelling a job is flows.cancel_job); a finished job cannot be cancelled."""
    job = _locked(session, job_id) or get_job(session=session, job_id=job_id)  # or NotFound
    return mark_finished(session=session, job=job, state=JobState.CANCELLED)


def _move(job: Job, state: JobState) -> None:
    if state not in NEXT_STATES.get(job.state, set()):
        raise Conflict("invalid_transition", f"job {job.id} cannot go from {job.state} "
                       f"to {state}")
    job.state = state
