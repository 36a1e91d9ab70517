"""What every task runs on: the process's WorkerContext (sessions on one engine per process,
the artifact store, the Celery app), and the one way a task touches its job.

A task claims its job, reads what it needs in a short transaction, works outside any
transaction, then stores its output and ends the job in one commit, only while the job is
still running (`running_job`, `finishing`). Progress writes and cancellations never wait on a
long transaction; what follows the job's end is service.flows.

While the work runs, a thread renews the job's lease every job_heartbeat_seconds
(service.jobs.leases); a worker that dies stops renewing it and the sweeper (worker.sweeper)
queues the job again. A database error means "later", never "lost": before the claim the
task is retried, after it the job's lease runs out and it is queued again. A cancelled job,
or one past job_time_limit_seconds (it fails with `time_limit`), stops renewing its lease
and its ONNX Runtime runs are terminated (RunOptions.terminate).
"""

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from celery import Celery, Task
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from flipgate.inference import allow_runs, terminate_runs
from service import flows
from service.config import Settings, get_settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.errors import ServiceError
from service.jobs.leases import renew
from service.jobs.models import Job, JobState
from service.jobs.service import claim_job, lock_running_job, set_progress
from service.observability.origin import job_origin
from service.observability.startup import start_process
from service.outbox import enqueue_after_commit
from service.projects.scoping import scope_session
from service.storage import ArtifactStore, open_store
from worker.app import app

PROGRESS_STEP = 0.05
CLAIM_RETRY_SECONDS = 5.0
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerContext:
    """What a task works with: sessions on the server's database, its artifact store, the
    Celery app that sends the jobs a task creates or releases, and the settings."""

    sessions: sessionmaker[Session]
    store: ArtifactStore
    celery: Celery
    settings: Settings

    @classmethod
    def from_settings(cls, settings: Settings, celery: Celery) -> "WorkerContext":
        """A context on the database and artifact store of `settings` (a new engine)."""
        return cls(create_session_factory(create_db_engine(settings)),
                   open_store(settings), celery, settings)


class JobStopped(Exception):
    """The job was cancelled or finished elsewhere while this task ran."""


class TimeLimit(ServiceError, status_code=500):
    """A run of a job took longer than FLIPGATE_JOB_TIME_LIMIT_SECONDS."""

    def __init__(self, seconds: float) -> None:
        super().__init__("time_limit", f"the job ran longer than its limit of {seconds:g} s "
                         "(FLIPGATE_JOB_TIME_LIMIT_SECONDS) and was stopped")


Work = Callable[[WorkerContext, int, dict[str, Any]], None]


@cache
def context() -> WorkerContext:
    """This process's context, from the FLIPGATE_* settings (the worker's one reading of
    them: tasks take them from the context); its rows stamped with their origin, and traced
    when asked for (service.observability), before its engine is made."""
    settings = get_settings()
    start_process(settings, "worker", logs=False)  # the worker's logging: worker.cli
    return WorkerContext.from_settings(settings, app)


def job_task(name: str, work: Work) -> Task:
    """A task of the worker's app, registered under `name`, that runs `work` on the job whose
    id it is sent (`run_job`); retried later while the database cannot be reached."""

    def run(task: Task, job_id: int) -> None:
        try:
            claimed = claim(context(), job_id)
        except DBAPIError as error:
            logger.warning("job %s not claimed (%s); retrying", job_id, error.orig)
            raise task.retry(countdown=CLAIM_RETRY_SECONDS) from error
        if claimed is None:
            logger.info("job %s is not queued (ended, running elsewhere, or unknown)", job_id)
            return
        with job_origin(request_id=claimed.request_id, traceparent=claimed.traceparent,
                        kind=claimed.kind, job_id=job_id):
            run_job(job_id, claimed.params, work)

    run.__doc__ = work.__doc__
    return app.task(name=name, bind=True, max_retries=None)(run)


@dataclass(frozen=True)
class Claimed:
    """What a task reads of the job it claimed: its params, and where it came from."""

    kind: str
    params: dict[str, Any]
    request_id: str | None
    traceparent: str | None


def claim(ctx: WorkerContext, job_id: int) -> Claimed | None:
    """The job once claimed, or None when it is not queued."""
    with session_scope(ctx.sessions) as session:
        job = claim_job(session=session, job_id=job_id)
        return None if job is None else Claimed(job.kind, dict(job.params), job.request_id,
                                                job.traceparent)


def run_job(job_id: int, params: dict[str, Any], work: Work) -> None:
    """Run `work` on a claimed job while its lease is renewed; a failure (SystemExit
    included) is written to the job row, a database error leaves the job to its lease."""
    ctx = context()
    started = time.monotonic()
    logger.info("job %s started", job_id)
    try:
        with heartbeat(ctx, job_id, ctx.settings.job_heartbeat_seconds,
                       ctx.settings.job_time_limit_seconds):
            work(ctx, job_id, params)
        logger.info("job %s ended in %.2f s", job_id, time.monotonic() - started)
    except JobStopped:
        logger.info("job %s stopped running while it was worked on", job_id)
    except DBAPIError:
        logger.exception("job %s lost its database; its lease will expire", job_id)
    except (Exception, SystemExit) as error:
        logger.exception("job %s failed", job_id)
        fail(ctx, job_id, error)
    finally:
        allow_runs()


@contextmanager
def heartbeat(ctx: WorkerContext, job_id: int, every_seconds: float,
              limit_seconds: float) -> Iterator[None]:
    """Renew the job's lease every `every_seconds` while the block runs. Once the job no
    longer runs (cancelled) or has run `limit_seconds` (it fails with `time_limit`), the
    beat stops and so do the block's ONNX Runtime runs; its next progress report stops it
    (JobStopped) wherever else it is."""
    stop, worker_thread = threading.Event(), threading.get_ident()
    ends_at = time.monotonic() + limit_seconds

    def beat() -> None:
        while not stop.wait(min(every_seconds, max(0.0, ends_at - time.monotonic()))):
            if time.monotonic() >= ends_at:
                fail(ctx, job_id, TimeLimit(limit_seconds))
                terminate_runs(worker_thread)
                return
            try:
                with session_scope(ctx.sessions) as session:
                    running = renew(session=session, job_id=job_id)
            except DBAPIError as error:
                logger.warning("job %s: lease not renewed (%s)", job_id, type(error).__name__)
                continue
            if not running:
                terminate_runs(worker_thread)
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def running_job(ctx: WorkerContext, job_id: int) -> Iterator[tuple[Session, Job]]:
    """A transaction in which the job is locked while it is running (the tasks it asks for
    are sent after its commit), bound to the job's project; JobStopped, and nothing kept,
    when it no longer runs."""
    with session_scope(ctx.sessions) as session:
        enqueue_after_commit(session=session, celery=ctx.celery)
        job = lock_running_job(session=session, job_id=job_id)
        if job is None:
            raise JobStopped
        scope_session(session, job.project_id)
        yield session, job


@contextmanager
def job_session(ctx: WorkerContext, job_id: int) -> Iterator[Session]:
    """A committing session bound to the project of the job `job_id`: for what its work reads
    outside running_job's lock (names resolve in the job's project only)."""
    with session_scope(ctx.sessions) as session:
        scope_session(session, session.get_one(Job, job_id).project_id)
        yield session


@contextmanager
def finishing(ctx: WorkerContext, job_id: int) -> Iterator[tuple[Session, dict[str, Any]]]:
    """A running_job transaction in which the work stores its output and fills the result;
    the job succeeds in the same commit."""
    with running_job(ctx, job_id) as (session, job):
        result: dict[str, Any] = {}
        yield session, result
        succeed(ctx, session, job, result)


def succeed(ctx: WorkerContext, session: Session, job: Job, result: dict[str, Any]) -> None:
    """The job succeeds with `result`, and what follows happens (service.flows)."""
    flows.finish_job(session=session, settings=ctx.settings, job=job,
                     state=JobState.SUCCEEDED, result=result)


def fail(ctx: WorkerContext, job_id: int, error: BaseException) -> None:
    """Mark the job failed with a one-line description of `error` that names no file of the
    server, if it is still running (the worker's log keeps the whole error)."""
    message = (f"{error.code}: {error.message}" if isinstance(error, ServiceError)
               else f"{type(error).__name__}: {error}")
    logger.warning("job %s failed: %s", job_id, message)
    message = SERVER_PATH.sub("<server path>", message)
    try:
        with running_job(ctx, job_id) as (session, job):
            flows.finish_job(session=session, settings=ctx.settings, job=job,
                             state=JobState.FAILED, error=message)
    except JobStopped:
        logger.info("job %s ended elsewhere before its failure was recorded", job_id)


# an absolute path (two or more segments) that no scheme, word or slash runs into
SERVER_PATH = re.compile(r"(?<![\w:/.~-])(?:/[^\s/'\"`:,;()\[\]]+){2,}/?")


class JobProgress:
    """A progress callback that writes the fraction done to the job row every PROGRESS_STEP,
    and stops the work (JobStopped) once the job is cancelled. A phase of a longer job maps
    its own 0..1 onto [start, start + span]."""

    def __init__(self, ctx: WorkerContext, job_id: int, start: float = 0.0,
                 span: float = 1.0) -> None:
        self.ctx, self.job_id, self.written = ctx, job_id, start
        self.start, self.span = start, span

    def __call__(self, done: int, total: int) -> None:
        fraction = min(1.0, self.start + self.span * (done / total if total else 1.0))
        if fraction - self.written < PROGRESS_STEP and fraction < 1.0:
            return
        with running_job(self.ctx, self.job_id) as (session, job):
            set_progress(session=session, job=job, progress=fraction)
        self.written = fraction
