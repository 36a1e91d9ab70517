"""The tasks. Each takes a job id, opens its own sessions, and does nothing once the job has
ended; a running job delivered again (its worker was lost before acking) is run again.

Reading, computing and storing happen in separate short transactions so that progress
writes and cancellations never wait on a long one; the output is stored and the job
finished in one commit, and only while the job is still running.
"""

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from service.artifacts import ArtifactStore
from service.compare.service import Pair, pair_report
from service.config import get_settings
from service.datasets.models import Dataset
from service.datasets.service import get_dataset
from service.db import create_db_engine, create_session_factory, session_scope
from service.errors import ServiceError
from service.gate.settling import settle_pending
from service.jobs.enqueue import enqueue_after_commit
from service.jobs.models import Job, JobState
from service.jobs.orchestration import send_ready_metrics
from service.jobs.service import (
    claim_job,
    create_shards,
    finish_job,
    get_job,
    list_shards,
    lock_running_job,
    set_progress,
)
from service.predictions.models import PredictionSource
from service.predictions.service import (
    read_logits_artifact,
    score_version,
    store_logits,
    store_predictions,
)
from service.queue import INFERENCE_TASK, METRICS_TASK
from service.registry.models import ModelVersion
from service.registry.service import get_version, qualified_name
from worker.app import app

PROGRESS_STEP = 0.05
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Context:
    """What a task works with: sessions on the server's database, its artifact store, and
    the Celery app that sends the jobs a task creates or releases."""

    sessions: sessionmaker[Session]
    store: ArtifactStore
    celery: Celery = app


class JobStopped(Exception):
    """The job was cancelled or finished elsewhere while this task ran."""


Work = Callable[[Context, int, dict[str, Any]], None]


@cache
def context() -> Context:
    """This process's context, from the FLIPGATE_* settings."""
    settings = get_settings()
    return Context(create_session_factory(create_db_engine(settings)),
                   ArtifactStore.from_settings(settings))


@app.task(name=INFERENCE_TASK)
def inference(job_id: int) -> None:
    """Compute and store a version's logits on an eval set."""
    run_job(job_id, infer)


@app.task(name=METRICS_TASK)
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
    """Score the version on the eval set and store the logits; an eval set of more than
    shard_size samples is split into shards instead, and a shard scores its range only."""
    with session_scope(ctx.sessions) as session:
        version = get_version(session=session, version_id=params["version_id"])
        dataset = get_dataset(session=session, name=params["evalset"])
    if "parent_id" in params:
        return infer_shard(ctx, job_id, params, version, dataset)
    if dataset.n > get_settings().shard_size:
        return split(ctx, job_id, dataset)
    logits, provider = score_version(store=ctx.store, version=version, dataset=dataset,
                                     progress=JobProgress(ctx.sessions, job_id))
    with finishing(ctx, job_id) as (session, result):
        result["provider"] = provider
        keep_logits(ctx, session, params, logits, result)


def keep_logits(ctx: Context, session: Session, params: dict[str, Any], logits: np.ndarray,
                result: dict[str, Any]) -> None:
    """Store the logits of the job's version on its eval set and describe them in `result`."""
    version = get_version(session=session, version_id=params["version_id"])
    prediction = store_predictions(
        session=session, store=ctx.store, version=version, logits=logits,
        dataset=get_dataset(session=session, name=params["evalset"]),
        source=PredictionSource.COMPUTED, provider=result["provider"])
    result.update(prediction_id=prediction.id, logits_sha256=prediction.logits_sha256,
                  version_url=_version_url(session, version))


def split(ctx: Context, job_id: int, dataset: Dataset) -> None:
    """Queue the shards of a running job (once: a job delivered again keeps its shards)."""
    size = get_settings().shard_size
    with session_scope(ctx.sessions) as session:
        enqueue_after_commit(session=session, celery=ctx.celery)
        job = lock_running_job(session=session, job_id=job_id)
        if job is None:
            raise JobStopped
        if not list_shards(session=session, job=job):
            create_shards(session=session, job=job, ranges=[
                (start, min(start + size, dataset.n)) for start in range(0, dataset.n, size)])


def infer_shard(ctx: Context, job_id: int, params: dict[str, Any], version: ModelVersion,
                dataset: Dataset) -> None:
    """Score the shard's sample range and keep its logits as an artifact; the shard that
    ends last merges them all into the parent's predictions in the same commit."""
    logits, provider = score_version(store=ctx.store, version=version, dataset=dataset,
                                     rows=slice(params["start"], params["stop"]),
                                     progress=JobProgress(ctx.sessions, job_id))
    with finishing(ctx, job_id) as (session, result):
        result.update(logits_sha256=store_logits(store=ctx.store, logits=logits),
                      provider=provider, worker=f"{socket.gethostname()}:{os.getpid()}")
        parent = get_job(session=session, job_id=params["parent_id"])
        shards = list_shards(session=session, job=parent)
        if all(shard.id == job_id or shard.state == JobState.SUCCEEDED for shard in shards):
            merge(ctx, session, parent, [logits if shard.id == job_id else _shard_logits(
                ctx, shard) for shard in shards], provider)


def _shard_logits(ctx: Context, shard: Job) -> np.ndarray:
    """The logits a finished shard kept."""
    return read_logits_artifact(store=ctx.store, sha256=shard.result["logits_sha256"])


def merge(ctx: Context, session: Session, parent: Job, parts: list[np.ndarray],
          provider: str) -> None:
    """Store the shards' logits, in order, as the parent's predictions; the parent succeeds."""
    result: dict[str, Any] = {"provider": provider, "shards": len(parts)}
    keep_logits(ctx, session, parent.params, np.concatenate(parts), result)
    succeed(session, parent, result)


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
        enqueue_after_commit(session=session, celery=ctx.celery)
        job = lock_running_job(session=session, job_id=job_id)
        if job is None:
            raise JobStopped
        result: dict[str, Any] = {}
        yield session, result
        succeed(session, job, result)


def succeed(session: Session, job: Job, result: dict[str, Any]) -> None:
    """The job succeeds; the metrics jobs that waited for its logits are sent after the
    commit, and the gate decisions that waited for it become final if nothing else is open."""
    finish_job(session=session, job=job, state=JobState.SUCCEEDED, result=result)
    send_ready_metrics(session=session, job=job)
    settle_pending(session=session)


def fail(ctx: Context, job_id: int, error: Exception) -> None:
    """Mark the job failed with a one-line description of `error` (if it is still running);
    the gate decisions waiting for it are blocked."""
    message = (f"{error.code}: {error.message}" if isinstance(error, ServiceError)
               else f"{type(error).__name__}: {error}")
    with session_scope(ctx.sessions) as session:
        enqueue_after_commit(session=session, celery=ctx.celery)
        job = lock_running_job(session=session, job_id=job_id)
        if job is not None:
            finish_job(session=session, job=job, state=JobState.FAILED, error=message)
            settle_pending(session=session)


class JobProgress:
    """A progress callback that writes the fraction done to the job row every PROGRESS_STEP,
    and stops the work (JobStopped) once the job is cancelled. A phase of a longer job maps
    its own 0..1 onto [start, start + span]."""

    def __init__(self, sessions: sessionmaker[Session], job_id: int, start: float = 0.0,
                 span: float = 1.0) -> None:
        self.sessions, self.job_id, self.written = sessions, job_id, start
        self.start, self.span = start, span

    def __call__(self, done: int, total: int) -> None:
        fraction = min(1.0, self.start + self.span * (done / total if total else 1.0))
        if fraction - self.written < PROGRESS_STEP and fraction < 1.0:
            return
        with session_scope(self.sessions) as session:
            job = lock_running_job(session=session, job_id=self.job_id)
            if job is None:
                raise JobStopped
            set_progress(session=session, job=job, progress=fraction)
        self.written = fraction
