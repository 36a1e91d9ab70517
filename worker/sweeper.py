"""The worker's sweeper: a process that, every sweep_seconds, queues again (or fails) the jobs
whose lease expired (service.flows.reap_lost_jobs), sends the queued jobs the broker has not
accepted (service.jobs.enqueue.send_unsent) and the callbacks that are due
(service.callbacks.scheduling.send_due), and, every mlflow_reconcile_seconds when an MLflow
tracking URI is set, the MLflow connector's reconcile job (worker.mlflow); every half
staging_idle_minutes it sweeps abandoned uploads (service.housekeeping: its host's staging
files, and a bucket's staging objects and multipart uploads when it is the deployment's one
sweeper of the bucket). Every `flipgate
worker` runs one in a process of its own (`python -m worker.sweeper`), never a thread of the
Celery process whose pool processes are forked from it (a forked SQLite connection breaks
locking); the worker starts it again when it exits (SupervisedSweeper), and it stops when
its parent does. Several sweepers share the work through row locks."""

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from celery import Celery
from sqlalchemy import exists, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from flipgate.processes import stop_process
from service import flows
from service.callbacks.scheduling import due_now, send_due
from service.config import Settings, get_settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.errors import StorageUnavailable
from service.housekeeping import SharedSweep, sweep_abandoned_uploads
from service.integrations.mlflow.service import queue_reconcile, serve_project
from service.jobs.enqueue import send_unsent
from service.jobs.leases import beat, lost_jobs, unsent_jobs
from service.observability.startup import start_process
from service.outbox import enqueue_after_commit
from service.storage import ArtifactStore, open_store

# a sweeper that exits is started again after a pause that doubles, from FIRST to LAST
# seconds, while each one dies within STEADY seconds of its start
FIRST_RESTART_SECONDS, LAST_RESTART_SECONDS, STEADY_SECONDS = 1.0, 30.0, 60.0
WATCH_SECONDS = 0.5  # how often the supervisor looks at its sweeper
BEAT_SECONDS = 10.0  # how often a worker's beat is written (the metrics' workers alive)
logger = logging.getLogger("worker.sweeper")  # not __main__ when run with -m


def has_work(session: Session, settings: Settings) -> bool:
    """Whether a job is lost or unsent or a callback due: read without the write lock that
    the sweep's own transactions take on SQLite (an idle sweeper never blocks writers)."""
    return bool(lost_jobs(session=session, lease_seconds=settings.job_lease_seconds)
                or unsent_jobs(session=session, resend_seconds=settings.job_resend_seconds)
                or session.scalar(select(exists().where(due_now()))))


def sweep(sessions: sessionmaker[Session], celery: Celery, settings: Settings) -> None:
    """One pass: lost jobs queued again or failed, unsent jobs sent, due callbacks sent (a
    callback not attempted job_resend_seconds after its send is due again)."""
    with session_scope(sessions) as session:
        lost = flows.reap_lost_jobs(session=session, settings=settings,
                                    lease_seconds=settings.job_lease_seconds,
                                    max_attempts=settings.job_attempts)
        for job in lost:
            logger.warning("job %s lost its worker: %s", job.id, job.state)
    with session_scope(sessions) as session:
        sent = send_unsent(session=session, celery=celery,
                           resend_seconds=settings.job_resend_seconds)
        if sent:
            logger.info("sent jobs %s to the broker", sent)
    with session_scope(sessions) as session:
        enqueue_after_commit(session=session, celery=celery)
        send_due(session=session, resend_seconds=settings.job_resend_seconds)


def reconcile_mlflow(sessions: sessionmaker[Session], celery: Celery,
                     settings: Settings) -> None:
    """Queue the MLflow connector's reconcile job (one at a time) in its project."""
    with session_scope(sessions) as session:
        enqueue_after_commit(session=session, celery=celery)
        serve_project(session=session, settings=settings)
        queue_reconcile(session=session)


def sweep_uploads(store: ArtifactStore, shared: SharedSweep | None, settings: Settings) -> None:
    """Abandoned uploads: this host's, and the bucket's when this sweeper is its sweeper."""
    try:
        swept = sweep_abandoned_uploads(store=store, shared=shared,
                                        idle_seconds=settings.staging_idle_minutes * 60)
    except (OSError, StorageUnavailable) as error:
        logger.warning("abandoned uploads not swept: %s", error)
        return
    if swept:
        logger.info("swept %d abandoned uploads", len(swept))


def sweep_while_parent_lives(celery: Celery, settings: Settings, parent: int,
                             queues: str = "") -> None:
    """Sweep every settings.sweep_seconds until `parent`, the process that started this one,
    ends (it is passed in: one that ended before this process started is not its parent);
    with `queues`, write the parent's beat (a worker seen alive) every BEAT_SECONDS."""
    engine = create_db_engine(settings)
    sessions, readers = create_session_factory(engine), sessionmaker(engine)
    store = open_store(settings)
    shared = SharedSweep(engine, settings.artifact_store) if settings.artifact_store else None
    reconcile_at = beat_at = uploads_at = time.monotonic()
    worker = f"{socket.gethostname()}:{parent}"
    logger.info("sweeping every %g s for worker %s", settings.sweep_seconds, worker)
    while os.getppid() == parent:
        time.sleep(settings.sweep_seconds)
        try:
            if queues and time.monotonic() >= beat_at:
                with session_scope(sessions) as session:
                    beat(session=session, worker=worker, queues=queues)
                beat_at = time.monotonic() + BEAT_SECONDS
            if settings.mlflow_tracking_uri and time.monotonic() >= reconcile_at:
                reconcile_mlflow(sessions, celery, settings)
                reconcile_at = time.monotonic() + settings.mlflow_reconcile_seconds
            if time.monotonic() >= uploads_at:
                sweep_uploads(store, shared, settings)
                uploads_at = time.monotonic() + settings.staging_idle_minutes * 60 / 2
            with session_scope(readers) as session:
                if not has_work(session, settings):
                    continue
            sweep(sessions, celery, settings)
        except DBAPIError as error:
            logger.warning("sweep skipped: the database failed (%s)", type(error).__name__)


def start_sweeper(queues: str = "") -> subprocess.Popen:
    """This module's loop in a child process (sharing this one's output) that ends with this
    process, and writes this process's beat (a worker taking `queues`) while it runs."""
    return subprocess.Popen([sys.executable, "-m", "worker.sweeper", str(os.getpid()), queues])


class SupervisedSweeper:
    """A sweeper process kept running by a thread of the process that starts it: one that
    exits (killed, or crashed) is logged and started again, after a pause that grows while
    sweepers keep dying soon after their start; `stop` ends both."""

    def __init__(self, start: Callable[[], subprocess.Popen] = start_sweeper) -> None:
        self.start, self.stopping = start, threading.Event()
        self.process = start()
        self.thread = threading.Thread(target=self.keep_running, name="sweeper-supervisor",
                                       daemon=True)
        self.thread.start()

    def keep_running(self) -> None:
        """Restart the sweeper each time it exits, until `stop`."""
        delay = FIRST_RESTART_SECONDS
        while True:
            started = time.monotonic()
            while self.process.poll() is None:
                if self.stopping.wait(WATCH_SECONDS):
                    return
            lived = time.monotonic() - started
            delay = FIRST_RESTART_SECONDS if lived >= STEADY_SECONDS else delay
            logger.warning("the sweeper (pid %s) exited with code %s after %.0f s; starting "
                           "another in %g s", self.process.pid, self.process.returncode,
                           lived, delay)
            if self.stopping.wait(delay):
                return
            self.process = self.start()
            logger.info("the sweeper runs again (pid %s)", self.process.pid)
            delay = min(2 * delay, LAST_RESTART_SECONDS)

    def stop_restarting(self, **_signal: object) -> None:
        """From now on a sweeper that exits stays down (the worker is shutting down)."""
        self.stopping.set()

    def stop(self) -> None:
        """Stop restarting, then stop the sweeper that runs."""
        self.stop_restarting()
        self.thread.join()
        stop_process(self.process)


if __name__ == "__main__":
    from worker.app import app

    settings = get_settings()
    start_process(settings, "sweeper")
    sweep_while_parent_lives(app, settings, parent=int(sys.argv[1]),
                             queues=sys.argv[2] if len(sys.argv) > 2 else "")
