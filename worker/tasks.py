"""The inference, metrics and matrix tasks (the training task is worker.training; what they
run on, worker.runtime). Each takes a job id and does nothing once the job has ended; a
running job delivered again (its worker was lost before acking) is run again."""

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service import flows, urls
from service.celery_app import INFERENCE_TASK, MATRIX_TASK, METRICS_TASK
from service.compare.matrix import matrix_inputs, store_pair_counts
from service.compare.service import pair_from_params, pair_inputs
from service.datasets.models import Dataset
from service.datasets.service import get_dataset
from service.jobs.enqueue import split_job
from service.jobs.models import Job
from service.jobs.service import last_shard_parts
from service.predictions.models import PredictionSource
from service.predictions.service import (
    LogitsFile,
    check_logits_file,
    concatenate_logits,
    give_classes,
    predicted_classes_artifact,
    read_logits_artifact,
    score_to_checked_file,
    score_version_to_file,
    store_logits_file,
)
from service.registry.models import ModelVersion
from service.registry.service import get_version, qualified_name
from worker.runtime import (
    JobProgress,
    WorkerContext,
    finishing,
    job_session,
    job_task,
    running_job,
    succeed,
)


def infer(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Score the version on the eval set and store the logits; an eval set of more than
    shard_size samples is split into shards instead, and a shard scores its range only.
    The samples are read memory-mapped and the logits written to disk batch by batch. A
    multi-label set is scored in one job: its probabilities, held in memory, and their
    decisions are stored."""
    with job_session(ctx, job_id) as session:
        version = get_version(session=session, version_id=params["version_id"])
        dataset = get_dataset(session=session, name=params["evalset"])
    if "parent_id" in params:
        return infer_shard(ctx, job_id, params, version, dataset)
    if dataset.n > ctx.settings.shard_size and not dataset.multilabel:
        return split(ctx, job_id, dataset)
    with scratch_file(ctx) as path:
        logits, provider = score_to_checked_file(store=ctx.store, version=version,
                                                 dataset=dataset, path=path,
                                                 progress=JobProgress(ctx, job_id))
        with finishing(ctx, job_id) as (session, result):
            result["provider"] = provider
            keep_logits(ctx, session, params, logits, result)


@contextmanager
def scratch_file(ctx: WorkerContext) -> Iterator[Path]:
    """A path for logits being written, in a fresh folder beside the store (so that storing
    them is a link, not a copy), removed afterwards."""
    with ctx.store.scratch() as folder:
        yield folder / "logits.npy"


def keep_logits(ctx: WorkerContext, session: Session, params: dict[str, Any],
                logits: LogitsFile, result: dict[str, Any]) -> None:
    """Store the checked logits file of the job's version on its eval set and describe them
    in `result`."""
    version = get_version(session=session, version_id=params["version_id"])
    dataset = get_dataset(session=session, name=params["evalset"])
    prediction = store_logits_file(
        session=session, store=ctx.store, version=version, dataset=dataset, logits=logits,
        source=PredictionSource.COMPUTED, provider=result["provider"])
    flows.logits_stored(session=session, version=version, dataset=dataset)
    result.update(prediction_id=prediction.id, logits_sha256=prediction.logits_sha256,
                  version_url=_version_url(session, version))


def split(ctx: WorkerContext, job_id: int, dataset: Dataset) -> None:
    """Queue the shards of a running job (once: a job delivered again keeps its shards)."""
    with running_job(ctx, job_id) as (session, job):
        split_job(session=session, job=job, samples=dataset.n, shard_size=ctx.settings.shard_size)


def infer_shard(ctx: WorkerContext, job_id: int, params: dict[str, Any], version: ModelVersion,
                dataset: Dataset) -> None:
    """Score the shard's sample range and keep its logits as an artifact; the shard that
    ends last merges them all into the parent's predictions in the same commit."""
    with scratch_file(ctx) as path:
        provider = score_version_to_file(store=ctx.store, version=version, dataset=dataset,
                                         path=path, rows=slice(params["start"], params["stop"]),
                                         progress=JobProgress(ctx, job_id))
        logits_sha256 = ctx.store.put_file(path).sha256
    with finishing(ctx, job_id) as (session, result):
        result.update(logits_sha256=logits_sha256, provider=provider,
                      worker=f"{socket.gethostname()}:{os.getpid()}")
        last = last_shard_parts(session=session, shard_id=job_id, part=logits_sha256,
                                key="logits_sha256")
        if last is not None:
            merge(ctx, session, *last, provider)


def merge(ctx: WorkerContext, session: Session, parent: Job, parts: list[str],
          provider: str) -> None:
    """Store the shards' logits (artifacts `parts`), streamed in order into one file, as the
    parent's predictions; the parent succeeds."""
    result: dict[str, Any] = {"provider": provider, "shards": len(parts)}
    with scratch_file(ctx) as path:
        concatenate_logits([read_logits_artifact(store=ctx.store, sha256=sha256)
                            for sha256 in parts], path)
        version = get_version(session=session, version_id=parent.params["version_id"])
        dataset = get_dataset(session=session, name=parent.params["evalset"])
        logits = check_logits_file(version=version, dataset=dataset, npy_path=path)
        keep_logits(ctx, session, parent.params, logits, result)
    succeed(ctx, session, parent, result)


def compare_pair(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Store the compare report of old → new on the eval set and its HTML page, computed
    outside any transaction over the memory-mapped logits, FLIPGATE_METRICS_CHUNK_ROWS
    samples at a time (a report stored meanwhile is kept). Predictions stored without their
    predicted classes get them here."""
    with job_session(ctx, job_id) as session:
        inputs = pair_inputs(session=session, pair=pair_from_params(session=session,
                                                                    params=params))
    report, html_sha256 = inputs.measure(ctx.store, chunk_rows=ctx.settings.metrics_chunk_rows,
                                         progress=JobProgress(ctx, job_id))
    classes = [predicted_classes_artifact(store=ctx.store, prediction=side)
               for side in (inputs.old, inputs.new)]
    with finishing(ctx, job_id) as (session, result):
        pair = pair_from_params(session=session, params=params)
        give_classes(session=session, predictions=[inputs.old, inputs.new], classes=classes)
        row = flows.pair_measured(session=session, job_id=job_id, pair=pair, report=report,
                                  html_sha256=html_sha256)
        result.update(nfr=row.nfr, churn=row.churn, compare_url=urls.compare(
            qualified_name(session=session, version=pair.old),
            qualified_name(session=session, version=pair.new), pair.dataset.name))


def compute_matrix(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Store the counts of every pair of the line's versions with logits on the eval set that
    has none yet, computed outside any transaction from their predicted classes (stored
    here for predictions kept without them), then inserted in one short transaction (a pair
    stored meanwhile is kept as it is)."""
    with job_session(ctx, job_id) as session:
        inputs = matrix_inputs(session=session, params=params)
    classes = inputs.classes(ctx.store)
    rows = inputs.count(ctx.store, classes)
    with finishing(ctx, job_id) as (session, result):
        give_classes(session=session, predictions=inputs.predictions, classes=classes)
        stored = store_pair_counts(session=session, rows=rows)
        result.update(pairs_stored=len(stored), matrix_url=urls.matrix(
            params["line"], params["evalset"]))


def _version_url(session: Session, version: ModelVersion) -> str:
    """The API address of a version."""
    line, name = qualified_name(session=session, version=version).split(":", 1)
    return urls.version(line, name)




inference = job_task(INFERENCE_TASK, infer)
metrics = job_task(METRICS_TASK, compare_pair)
matrix = job_task(MATRIX_TASK, compute_matrix)
