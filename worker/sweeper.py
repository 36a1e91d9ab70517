"""The worker process's sweeper: a thread that, every sweep_seconds, queues again (or fails)
the jobs whose lease expired (service.flows.reap_lost_jobs) and sends the queued jobs the
broker has not accepted (service.jobs.enqueue.send_unsent). Every `flipgate worker` runs one;
several sweepers share the work through row locks."""

import logging
import os
import threading

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service import flows
from service.config import Settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.jobs.enqueue import send_unsent

logger = logging.getLogger(__name__)


def sweep(sessions: sessionmaker[Session], celery: Celery, settings: Settings) -> None:
    """One pass: lost jobs queued again or failed, then unsent jobs sent."""
    with session_scope(sessions) as session:
        lost = flows.reap_lost_jobs(session=session, lease_seconds=settings.job_lease_seconds,
                                    max_attempts=settings.job_attempts)
        for job in lost:
            logger.warning("job %s lost its worker: %s", job.id, job.state)
    with session_scope(sessions) as session:
        sent = send_unsent(session=session, celery=celery,
                           resend_seconds=settings.job_resend_seconds)
        if sent:
            logger.info("sent jobs %s to the broker", sent)


def start_sweeper(celery: Celery, settings: Settings) -> threading.Event:
    """Sweep every settings.sweep_seconds in a daemon thread until the returned event is set.
    Its engine is disposed of in processes forked later (the pool's), never shared with them."""
    engine = create_db_engine(settings)
    os.register_at_fork(after_in_child=lambda: _forget(engine))
    sessions, stop = create_session_factory(engine), threading.Event()

    def loop() -> None:
        while not stop.wait(settings.sweep_seconds):
            try:
                sweep(sessions, celery, settings)
            except DBAPIError as error:
                logger.warning("sweep skipped: the database failed (%s)", type(error).__name__)

    threading.Thread(target=loop, name="flipgate-sweeper", daemon=True).start()
    return stop


def _forget(engine: Engine) -> None:
    engine.dispose(close=False)
