"""Jobs as leases, and the job row as the outbox message.

A running job is a lease: its worker renews heartbeat_at while it works, and a job whose
heartbeat is older than the lease is lost (service.flows.reap_lost_jobs queues it again or
fails it). A queued job is a message not yet delivered: it is sent until the broker has
accepted it (sent_at), and sent again when it is still queued long after that, so a broker
restart, a lost message or an API that died between its commit and the send loses nothing.
A worker claims only queued jobs, so a message delivered twice runs its job once.
"""

from datetime import timedelta

from sqlalchemy import delete, exists, or_, select, update
from sqlalchemy.orm import Session, aliased

from service.db import utcnow
from service.jobs.models import Job, JobDependency, JobState, WorkerBeat


def renew(*, session: Session, job_id: int) -> bool:
    """Renew the lease of a running job; whether it is still running."""
    renewed = session.execute(update(Job).where(Job.id == job_id, Job.state == JobState.RUNNING)
                              .values(heartbeat_at=utcnow()))
    return renewed.rowcount > 0


def lost_jobs(*, session: Session, lease_seconds: float) -> list[Job]:
    """The running jobs, locked, whose worker has not renewed their lease for
    `lease_seconds` (a job split into shards is not worked on itself: its shards are)."""
    shard = aliased(Job)
    statement = select(Job).where(
        Job.state == JobState.RUNNING,
        Job.heartbeat_at < utcnow() - timedelta(seconds=lease_seconds),
        ~exists().where(shard.parent_id == Job.id))
    return list(session.scalars(statement.order_by(Job.id).with_for_update(skip_locked=True)))


def requeue(*, session: Session, job: Job) -> Job:
    """Put a lost running job back in the queue, to be sent again (its attempts are kept)."""
    job.state, job.progress, job.heartbeat_at, job.sent_at = JobState.QUEUED, 0.0, None, None
    session.flush()
    return job


def unsent_jobs(*, session: Session, resend_seconds: float) -> list[Job]:
    """The queued jobs, locked, whose dependencies have all succeeded and whose message the
    broker has not accepted, or accepted more than `resend_seconds` ago."""
    other = aliased(Job)
    blocked = exists().where(JobDependency.job_id == Job.id,
                             other.id == JobDependency.waits_for_id,
                             other.state != JobState.SUCCEEDED)
    statement = select(Job).where(
        Job.state == JobState.QUEUED, ~blocked,
        or_(Job.sent_at.is_(None), Job.sent_at < utcnow() - timedelta(seconds=resend_seconds)))
    return list(session.scalars(statement.order_by(Job.id).with_for_update(skip_locked=True)))


def mark_sent(*, session: Session, job_ids: list[int]) -> None:
    """Record that the broker accepted the messages of these jobs just now."""
    if job_ids:
        session.execute(update(Job).where(Job.id.in_(job_ids)).values(sent_at=utcnow()))


WORKER_BEATS_KEPT = timedelta(days=1)  # a worker unseen this long is forgotten


def beat(*, session: Session, worker: str, queues: str) -> None:
    """Record that `worker` (host:pid), taking `queues`, is alive now; forget the workers
    unseen for WORKER_BEATS_KEPT."""
    now = utcnow()
    session.merge(WorkerBeat(name=worker, queues=queues, seen_at=now))
    session.execute(delete(WorkerBeat).where(WorkerBeat.seen_at < now - WORKER_BEATS_KEPT))
    session.flush()
