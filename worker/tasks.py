"""The tasks. Each takes a job id, opens its own sessions, and does nothing once the job has
ended; a running job delivered again (its worker was lost before acking) is run again.

Reading, computing and storing happen in separate short transactions so that progress
writes and cancellations never wait on a long one; the output is stored and the job
finished in one commit, and only while the job is still running.
"""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service.artifacts import ArtifactStore
from service.compare.service import Pair, pair_report
from service.config import get_settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.errors import ServiceError
from service.evalsets.service import get_dataset
from service.jobs.enqueue import TASK_NAMES
from service.jobs.models import JobKind, JobState
from service.jobs.service import claim_job, finish_job, lock_running_job, set_progress
from service.models.models import ModelVersion
from service.models.service import get_version, qualified_name
from service.predictions.models import PredictionSource
from service.predictions.service import score_version, store_predictions
from worker.app import app

PROGRESS_STEP = 0.05
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Context:
    """What a task works with: sessions on the server's database and its artifact store."""

    sessions: sessionmaker[Session]
    store: ArtifactStore


class JobStopped(Exception):
    """The job was cancelled or finished elsewhere while this task ran."""


Work = Callable[[Context, int, dict[str, Any]], None]


@cache
def context() -> Context:
    """This process's context, from the FLIPGATE_* settings."""
    settings = get_settings()
    return Context(create_session_factory(create_db_engine(settings)),
                   ArtifactStore.from_settings(settings))


@app.task(name=TASK_NAMES[JobKind.INFERENCE])
def inference(job_id: int) -> None:
    """Compute and store a version's logits on an eval set."""
    run_job(job_id, infer)


@app.task(name=TASK_NAMES[JobKind.METRICS])
def metrics(job_id: int) -> None:
    """Compute and store the compare report of two versions on an eval set."""
    run_job(job_id, compare_pair)


def run_job(job_id: int, work: Work) -> None:
    """Claim the job and run `work`; a failure is written to the job row."""
    ctx = context()
    with session_scope(ctx.sessions) as session:
        job = claim_job(session=session, job_id=job_id)
        params = None if job is None else dict(job.params)
    if params is None:
        logger.info("job %s has ended or does not exist; nothing to do", job_id)
        return
    try:
        work(ctx, job_id, params)
    except JobStopped:
        logger.info("job %s stopped running while it was worked on", job_id)
    except Exception as error:
        logger.exception("job %s failed", job_id)
        fail(ctx, job_id, error)


def infer(ctx: Context, job_id: int, params: dict[str, Any]) -> None:
    """Score the version on the eval set (unless its logits exist) and store the logits."""
    with session_scope(ctx.sessions) as session:
        version = get_version(session=session, version_id=params["version_id"])
        dataset = get_dataset(session=session, name=params["evalset"])
    logits, provider = score_version(store=ctx.store, version=version, dataset=dataset,
                                     progress=JobProgress(ctx.sessions, job_id))
    with finishing(ctx, job_id) as (session, result):
        version = get_version(session=session, version_id=params["version_id"])
        prediction = store_predictions(
            session=session, store=ctx.store, version=version, logits=logits,
            dataset=get_dataset(session=session, name=params["evalset"]),
            source=PredictionSource.COMPUTED, provider=provider)
        result.update(prediction_id=prediction.id, provider=prediction.provider,
                      logits_sha256=prediction.logits_sha256,
                      version_url=_version_url(session, version))


def compare_pair(ctx: Context, job_id: int, params: dict[str, Any]) -> None:
    """Store the compare report of old → new on the eval set."""
    with finishing(ctx, job_id) as (session, result):
        pair = Pair(old=get_version(session=session, version_id=params["old_version_id"]),
                    new=get_version(session=session, version_id=params["new_version_id"]),
                    dataset=get_dataset(session=session, name=params["evalset"]))
        report = pair_report(session=session, store=ctx.store, pair=pair)
        result.update(nfr=report["nfr"], churn=report["churn"], compare_url=(
            f"/compare/{report['old']['source']}/{report['new']['source']}"
            f"?evalset={pair.dataset.name}"))


def _version_url(session: Session, version: ModelVersion) -> str:
    """The API address of a version."""
    line, name = qualified_name(session=session, version=version).split(":", 1)
    return f"/models/{line}/versions/{name}"


@contextmanager
def finishing(ctx: Context, job_id: int) -> Iterator[tuple[Session, dict[str, Any]]]:
    """A session in which the work stores its output and fills the result; the job succeeds
    in the same commit. JobStopped (nothing kept) when it is no longer running."""
    with session_scope(ctx.sessions) as session:
        job = lock_running_job(session=session, job_id=job_id)
        if job is None:
            raise JobStopped
        result: dict[str, Any] = {}
        yield session, result
        finish_job(session=session, job=job, state=JobState.SUCCEEDED, result=result)


def fail(ctx: Context, job_id: int, error: Exception) -> None:
    """Mark the job failed with a one-line description of `error` (if it is still running)."""
    message = (f"{error.code}: {error.message}" if isinstance(error, ServiceError)
               else f"{type(error).__name__}: {error}")
    with session_scope(ctx.sessions) as session:
        job = lock_running_job(session=session, job_id=job_id)
        if job is not None:
            finish_job(session=session, job=job, state=JobState.FAILED, error=message)


class JobProgress:
    """A progress callback that writes the fraction done to the job row every PROGRESS_STEP,
    and stops the work (JobStopped) once the job is cancelled."""

    def __init__(self, sessions: sessionmaker[Session], job_id: int) -> None:
        self.sessions, self.job_id, self.written = sessions, job_id, 0.0

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        if fraction - self.written < PROGRESS_STEP and fraction < 1.0:
            return
        with session_scope(self.sessions) as session:
            job = lock_running_job(session=session, job_id=self.job_id)
            if job is None:
                raise JobStopped
            set_progress(session=session, job=job, progress=fraction)
        self.written = fraction
