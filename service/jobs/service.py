"""Creating jobs and moving them through their states."""

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db import one_or_not_found, utcnow
from service.errors import Conflict, InvalidInput
from service.jobs.models import Job, JobKind, JobState
from service.queue import JOB_TASKS

NEXT_STATES = {
    JobState.QUEUED: {JobState.RUNNING, JobState.CANCELLED},
    JobState.RUNNING: {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED},
}
FINAL_STATES = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
OPEN_STATES = {JobState.QUEUED, JobState.RUNNING}
TASKS_TO_SEND = "flipgate.tasks_to_send"  # session.info key: (task name, argument) pairs


def create_job(*, session: Session, kind: JobKind, params: dict[str, Any],
               parent: Job | None = None, send: bool = True) -> Job:
    """Queue a job (a shard when `parent` is given), sent after the commit unless `send` is
    false (a job waiting for others, sent later with `send_after_commit`)."""
    job = Job(kind=kind, params=params, parent=parent)
    session.add(job)
    session.flush()
    if send:
        send_after_commit(session=session, job=job)
    return job


def send_after_commit(*, session: Session, job: Job) -> None:
    """Have the task of a queued job sent once the session commits (service.jobs.enqueue)."""
    send_task_after_commit(session=session, task=JOB_TASKS[job.kind], argument=job.id)


def send_task_after_commit(*, session: Session, task: str, argument: int) -> None:
    """Have the Celery task `task` sent with one argument once the session commits."""
    session.info.setdefault(TASKS_TO_SEND, []).append((task, argument))


def create_shards(*, session: Session, job: Job, ranges: list[tuple[int, int]]) -> list[Job]:
    """Queue one shard of `job` per sample range [start, stop), with the job's params."""
    return [create_job(session=session, kind=job.kind, parent=job,
                       params={**job.params, "parent_id": job.id, "start": start, "stop": stop})
            for start, stop in ranges]


def list_shards(*, session: Session, job: Job) -> list[Job]:
    """The shards of a job in the order they were created (their sample ranges' order)."""
    return list(session.scalars(select(Job).where(Job.parent_id == job.id).order_by(Job.id)))


def queue_job(*, session: Session, kind: JobKind, params: dict[str, Any],
              send: bool = True) -> Job:
    """The open (queued or running) job of this kind with these params, else a new one
    (sent after the commit unless `send` is false)."""
    statement = select(Job).where(Job.kind == kind, Job.state.in_(OPEN_STATES)).order_by(Job.id)
    existing = next((job for job in session.scalars(statement) if job.params == params), None)
    return existing or create_job(session=session, kind=kind, params=params, send=send)


def waiting_for(*, session: Session, job: Job) -> list[Job]:
    """The queued jobs that wait for `job` (its id in their params' "after"), locked."""
    queued = session.execute(select(Job.id, Job.params).where(Job.state == JobState.QUEUED))
    ids = [row.id for row in queued if job.id in row.params.get("after", [])]
    statement = select(Job).where(Job.id.in_(ids), Job.state == JobState.QUEUED).order_by(Job.id)
    return list(session.scalars(statement.with_for_update()
                                .execution_options(populate_existing=True)))


def get_job(*, session: Session, job_id: int) -> Job:
    """The job with this id."""
    return one_or_not_found(session, select(Job).where(Job.id == job_id),
                            code="job_not_found", message=f"no job {job_id}")


def claim_job(*, session: Session, job_id: int) -> Job | None:
    """Lock a job and start it when queued (a running one is resumed after a lost worker);
    None when it is unknown or already finished or cancelled."""
    job = _locked(session, job_id)
    if job is None or job.state in FINAL_STATES:
        return None
    if job.state == JobState.QUEUED:
        start_job(session=session, job=job)
    return job


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
    """Mark a queued job as running."""
    _move(job, JobState.RUNNING)
    job.started_at = utcnow()
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


def finish_job(*, session: Session, job: Job, state: JobState,
               result: dict[str, Any] | None = None, error: str | None = None) -> Job:
    """End a job as succeeded (with its result), failed (with an error) or cancelled."""
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
        finish_job(session=session, job=shard, state=JobState.CANCELLED)
    parent = None if job.parent_id is None else session.get_one(Job, job.parent_id)
    reason = f"{job.state}: {job.error or 'no error recorded'}"
    if parent is not None and parent.state in OPEN_STATES:
        finish_job(session=session, job=parent, state=JobState.FAILED,
                   error=f"shard {job.id} {reason}")
    for waiting in waiting_for(session=session, job=job):
        finish_job(session=session, job=waiting, state=JobState.CANCELLED,
                   error=f"job {job.id}, which it waited for, {reason}")


def cancel_job(*, session: Session, job_id: int) -> Job:
    """Cancel a queued or running job and its shards; a finished job cannot be cancelled."""
    job = _locked(session, job_id) or get_job(session=session, job_id=job_id)  # or NotFound
    return finish_job(session=session, job=job, state=JobState.CANCELLED)


def _move(job: Job, state: JobState) -> None:
    if state not in NEXT_STATES.get(job.state, set()):
        raise Conflict("invalid_transition", f"job {job.id} cannot go from {job.state} "
                       f"to {state}")
    job.state = state
