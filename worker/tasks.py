"""The inference and metrics tasks (the training task is worker.training; what they run on,
worker.runtime). Each takes a job id and does nothing once the job has ended; a running job
delivered again (its worker was lost before acking) is run again."""

import os
import socket
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from flipgate.metrics.report import compare_logits
from service import flows
from service.compare.service import pair_from_params, pair_inputs, store_pair_metrics
from service.config import get_settings
from service.datasets.models import Dataset
from service.datasets.service import get_dataset, read_groups
from service.db import session_scope
from service.jobs.enqueue import create_shards
from service.jobs.models import Job, JobState
from service.jobs.service import get_job, list_shards
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
from worker.runtime import (
    JobProgress,
    WorkerContext,
    finishing,
    job_task,
    running_job,
    succeed,
)


def infer(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
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
                                     progress=JobProgress(ctx, job_id))
    with finishing(ctx, job_id) as (session, result):
        result["provider"] = provider
        keep_logits(ctx, session, params, logits, result)


def keep_logits(ctx: WorkerContext, session: Session, params: dict[str, Any], logits: np.ndarray,
                result: dict[str, Any]) -> None:
    """Store the logits of the job's version on its eval set and describe them in `result`."""
    version = get_version(session=session, version_id=params["version_id"])
    dataset = get_dataset(session=session, name=params["evalset"])
    prediction = store_predictions(
        session=session, store=ctx.store, version=version, logits=logits, dataset=dataset,
        source=PredictionSource.COMPUTED, provider=result["provider"])
    flows.logits_stored(session=session, version=version, dataset=dataset)
    result.update(prediction_id=prediction.id, logits_sha256=prediction.logits_sha256,
                  version_url=_version_url(session, version))


def split(ctx: WorkerContext, job_id: int, dataset: Dataset) -> None:
    """Queue the shards of a running job (once: a job delivered again keeps its shards)."""
    size = get_settings().shard_size
    with running_job(ctx, job_id) as (session, job):
        if not list_shards(session=session, job=job):
            create_shards(session=session, job=job, ranges=[
                (start, min(start + size, dataset.n)) for start in range(0, dataset.n, size)])


def infer_shard(ctx: WorkerContext, job_id: int, params: dict[str, Any], version: ModelVersion,
                dataset: Dataset) -> None:
    """Score the shard's sample range and keep its logits as an artifact; the shard that
    ends last merges them all into the parent's predictions in the same commit."""
    logits, provider = score_version(store=ctx.store, version=version, dataset=dataset,
                                     rows=slice(params["start"], params["stop"]),
                                     progress=JobProgress(ctx, job_id))
    with finishing(ctx, job_id) as (session, result):
        result.update(logits_sha256=store_logits(store=ctx.store, logits=logits),
                      provider=provider, worker=f"{socket.gethostname()}:{os.getpid()}")
        parent = get_job(session=session, job_id=params["parent_id"])
        shards = list_shards(session=session, job=parent)
        if all(shard.id == job_id or shard.state == JobState.SUCCEEDED for shard in shards):
            merge(ctx, session, parent, [logits if shard.id == job_id else _shard_logits(
                ctx, shard) for shard in shards], provider)


def _shard_logits(ctx: WorkerContext, shard: Job) -> np.ndarray:
    """The logits a finished shard kept."""
    return read_logits_artifact(store=ctx.store, sha256=shard.result["logits_sha256"])


def merge(ctx: WorkerContext, session: Session, parent: Job, parts: list[np.ndarray],
          provider: str) -> None:
    """Store the shards' logits, in order, as the parent's predictions; the parent succeeds."""
    result: dict[str, Any] = {"provider": provider, "shards": len(parts)}
    keep_logits(ctx, session, parent.params, np.concatenate(parts), result)
    succeed(session, parent, result)


def compare_pair(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Store the compare report of old → new on the eval set, computed outside any
    transaction (a report stored meanwhile is kept)."""
    with session_scope(ctx.sessions) as session:
        inputs = pair_inputs(session=session, pair=pair_from_params(session=session,
                                                                    params=params))
    analysis = inputs.analyse(ctx.store)
    report = compare_logits(analysis.old_logits, analysis.new_logits, analysis.labels,
                            groups=read_groups(store=ctx.store, dataset=inputs.dataset))
    with finishing(ctx, job_id) as (session, result):
        pair = pair_from_params(session=session, params=params)
        row = store_pair_metrics(session=session, old=pair.old, new=pair.new,
                                 dataset=pair.dataset, report=report)
        result.update(nfr=row.nfr, churn=row.churn, compare_url=(
            f"/compare/{qualified_name(session=session, version=pair.old)}"
            f"/{qualified_name(session=session, version=pair.new)}?evalset={pair.dataset.name}"))


def _version_url(session: Session, version: ModelVersion) -> str:
    """The API address of a version."""
    line, name = qualified_name(session=session, version=version).split(":", 1)
    return f"/models/{line}/versions/{name}"




inference = job_task(INFERENCE_TASK, infer)
metrics = job_task(METRICS_TASK, compare_pair)
