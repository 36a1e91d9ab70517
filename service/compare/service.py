"""Pair metrics: queueing their measurement, storing the metrics job's report, and reading
them back as a report or a line's pairwise matrix (a request never computes one)."""

import io
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from flipgate.metrics import measure_pair
from flipgate.progress import Progress
from flipgate.reporting.html import render_html
from service.artifacts import ArtifactStore
from service.compare.models import REPORT_SCALARS, PairMetrics
from service.compare.schemas import MissingPair, PairMatrix
from service.datasets.models import Dataset
from service.datasets.service import get_dataset, read_groups, read_labels
from service.db import insert_or_conflict
from service.errors import InvalidInput, NotFound
from service.jobs.enqueue import queue_job
from service.jobs.models import Job, JobKind
from service.jobs.service import OPEN_STATES, find_open_job
from service.predictions.models import Prediction
from service.predictions.service import (
    get_predictions,
    queue_missing_inference,
    read_logits,
    versions_with_predictions,
)
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import (
    get_version,
    list_versions,
    qualified_name,
    resolve_reference,
)

MATRIX_METRICS = ("nfr", "pfr", "churn")


@dataclass(frozen=True)
class Pair:
    """An old and a new version and the data set they are compared on."""

    old: ModelVersion
    new: ModelVersion
    dataset: Dataset


def store_pair_metrics(*, session: Session, old: ModelVersion, new: ModelVersion,
                       dataset: Dataset, report: dict[str, Any],
                       html_sha256: str | None = None) -> PairMetrics:
    """Keep a `compare_logits` report of old → new on a data set (and the address of its HTML
    page); a stored triple is returned."""
    _check_report(old, new, dataset, report)
    existing = find_pair_metrics(session=session, old=old, new=new, dataset=dataset)
    if existing is not None:
        return existing
    low, high = report["nfr_ci"]
    row = PairMetrics(old_version=old, new_version=new, dataset=dataset, report=report,
                      html_sha256=html_sha256, nfr_ci_low=low, nfr_ci_high=high,
                      **{name: report[name] for name in REPORT_SCALARS})
    return insert_or_conflict(session, row, code="pair_metrics_exist", message=f"versions "
                              f"{old.id} → {new.id} on {dataset.name!r} are being stored")


def _check_report(old: ModelVersion, new: ModelVersion, dataset: Dataset,
                  report: dict[str, Any]) -> None:
    """Two distinct versions, and a complete report over every sample of the data set."""
    if old.id == new.id:
        raise InvalidInput("same_version", f"version {old.id} cannot be compared with itself")
    missing = sorted({*REPORT_SCALARS, "nfr_ci"} - report.keys())
    if missing or report["n"] != dataset.n:
        raise InvalidInput("invalid_report", f"not a compare report over the {dataset.n} "
                           f"samples of {dataset.name!r} (missing keys: {missing})")


def pair_metrics_among(*, session: Session, versions: list[ModelVersion],
                         dataset: Dataset) -> list[PairMetrics]:
    """The stored pair metrics between any two of `versions` on a data set."""
    ids = [version.id for version in versions]
    return list(session.scalars(_pair_metrics_query(ids, ids, dataset)))


def _pair_metrics_query(old_ids: list[int], new_ids: list[int],
                        dataset: Dataset) -> Select[tuple[PairMetrics]]:
    return select(PairMetrics).where(PairMetrics.dataset_id == dataset.id,
                                     PairMetrics.old_version_id.in_(old_ids),
                                     PairMetrics.new_version_id.in_(new_ids))


def find_pair_metrics(*, session: Session, old: ModelVersion, new: ModelVersion,
                      dataset: Dataset) -> PairMetrics | None:
    """The stored pair metrics of old → new on a data set, if any."""
    return session.scalars(_pair_metrics_query([old.id], [new.id], dataset)).one_or_none()


def versions_matrix(*, session: Session, versions: list[ModelVersion],
                    dataset: Dataset) -> PairMatrix:
    """NFR, PFR and churn of every ordered pair of `versions`, from stored rows."""
    position = {version.id: index for index, version in enumerate(versions)}
    size = len(versions)
    matrices = {name: [[0.0 if i == j else None for j in range(size)] for i in range(size)]
                for name in MATRIX_METRICS}
    for row in pair_metrics_among(session=session, versions=versions, dataset=dataset):
        for name, matrix in matrices.items():
            matrix[position[row.old_version_id]][position[row.new_version_id]] = getattr(row, name)
    return PairMatrix(versions=[version.version for version in versions], **matrices)


def resolve_pair(*, session: Session, old: str, new: str, evalset: str) -> Pair:
    """The versions named by two references ("line:version" or "line@alias") and an eval set."""
    pair = Pair(old=resolve_reference(session=session, reference=old),
                new=resolve_reference(session=session, reference=new),
                dataset=get_dataset(session=session, name=evalset))
    if pair.old.id == pair.new.id or pair.old.num_classes != pair.new.num_classes:
        raise InvalidInput("incomparable_versions", f"{old} and {new} must be two different "
                           "versions with the same number of classes")
    return pair


def stored_report(*, session: Session, pair: Pair) -> dict[str, Any] | None:
    """The pair's stored report with the keys of `flipgate compare --json`, if measured."""
    row = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
    if row is None:
        return None
    return {**row.report, **pair_inputs(session=session, pair=pair).sources()}


def stored_html(*, session: Session, store: ArtifactStore, pair: Pair) -> bytes:
    """The HTML page that the pair's metrics job drew; NotFound `report_html_not_stored` for
    a pair measured before pages were kept (no request draws one)."""
    row = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
    if row is None or row.html_sha256 is None:
        raise NotFound("report_html_not_stored", "this pair was measured before HTML reports "
                       "were kept; its JSON report is stored (format=json)")
    with store.open(row.html_sha256) as readable:
        return readable.read()


@dataclass(frozen=True)
class PairInputs:
    """The stored logits of both versions and the data set that a pair's report is computed
    from, and the versions' names; measuring needs no session (the metrics job does it
    outside any transaction)."""

    old: Prediction
    new: Prediction
    dataset: Dataset
    names: tuple[str, str]
    class_names: list[str] | None

    def measure(self, store: ArtifactStore, *, chunk_rows: int | None = None,
                progress: Progress | None = None) -> tuple[dict[str, Any], str]:
        """The pair's report (with its per-group table when the eval set has groups) and the
        address of its HTML page (stored), from one pass over both logits memory-mapped
        `chunk_rows` samples at a time: memory stays a few chunks plus a few values per
        sample, whatever N is."""
        old, new = (read_logits(store=store, prediction=side) for side in (self.old, self.new))
        labels = read_labels(store=store, dataset=self.dataset)
        report, values = measure_pair(old, new, labels, chunk_size=chunk_rows,
                                      progress=progress,
                                      groups=read_groups(store=store, dataset=self.dataset))
        page = render_html(values, {**report, **self.sources()},
                           old_name=self.names[0], new_name=self.names[1],
                           class_names=self.class_names)
        return report, store.put_stream(io.BytesIO(page.encode())).sha256

    def sources(self) -> dict[str, dict[str, str]]:
        """The "old" and "new" entries of the report."""
        return {side: {"source": name, "provider": prediction.provider or prediction.source.value}
                for side, name, prediction in zip(("old", "new"), self.names,
                                                  (self.old, self.new), strict=True)}


def pair_inputs(*, session: Session, pair: Pair) -> PairInputs:
    """The stored predictions of the pair's versions on its data set."""
    return PairInputs(*(get_predictions(session=session, version=version, dataset=pair.dataset)
                        for version in (pair.old, pair.new)), pair.dataset,
                      (qualified_name(session=session, version=pair.old),
                       qualified_name(session=session, version=pair.new)),
                      session.get_one(ModelLine, pair.new.line_id).class_names)


def metrics_params(pair: Pair) -> dict[str, Any]:
    """The params of the metrics job of a pair (read back by `pair_from_params`)."""
    return {"old_version_id": pair.old.id, "new_version_id": pair.new.id,
            "evalset": pair.dataset.name}


def pair_from_params(*, session: Session, params: dict[str, Any]) -> Pair:
    """The pair a metrics job measures."""
    return Pair(old=get_version(session=session, version_id=params["old_version_id"]),
                new=get_version(session=session, version_id=params["new_version_id"]),
                dataset=get_dataset(session=session, name=params["evalset"]))


def queue_measurement(*, session: Session, pair: Pair) -> list[Job]:
    """The jobs that store the pair's metrics: an inference job per version without logits
    on the data set and the metrics job that waits for them, last (the open ones when they
    are queued already); none when the metrics are stored."""
    if find_pair_metrics(session=session, old=pair.old, new=pair.new,
                         dataset=pair.dataset) is not None:
        return []
    inference = queue_missing_inference(session=session, versions=[pair.old, pair.new],
                                        dataset=pair.dataset)
    return [*inference, queue_job(session=session, kind=JobKind.METRICS,
                                  params=metrics_params(pair), waits_for=inference)]


def open_measurement(*, session: Session, pair: Pair) -> Job | None:
    """The queued or running metrics job of the pair, if any."""
    return find_open_job(session=session, kind=JobKind.METRICS, params=metrics_params(pair))


def line_matrix(*, session: Session, line_name: str, dataset: Dataset) -> PairMatrix:
    """The stored matrix over the line's versions that have logits on `dataset`, with the
    pairs not stored yet and their open metrics jobs."""
    versions = _versions_with_logits(session, line_name, dataset)
    open_jobs = _open_metrics_jobs(session, dataset)
    missing = [MissingPair(old=old.version, new=new.version, job_id=open_jobs.get((old.id, new.id)))
               for old, new in _missing_pairs(session, versions, dataset)]
    return versions_matrix(session=session, versions=versions, dataset=dataset).model_copy(
        update={"missing": missing})


def queue_missing_pairs(*, session: Session, line_name: str, dataset: Dataset) -> list[Job]:
    """A metrics job (the open one, or a new one) per pair of the line's matrix on `dataset`
    that is not stored yet."""
    versions = _versions_with_logits(session, line_name, dataset)
    return [job for old, new in _missing_pairs(session, versions, dataset)
            for job in queue_measurement(session=session, pair=Pair(old, new, dataset))]


def _versions_with_logits(session: Session, line_name: str,
                          dataset: Dataset) -> list[ModelVersion]:
    return versions_with_predictions(session=session, dataset=dataset, versions=list_versions(
        session=session, line_name=line_name))


def _missing_pairs(session: Session, versions: list[ModelVersion],
                   dataset: Dataset) -> list[tuple[ModelVersion, ModelVersion]]:
    """The ordered pairs of `versions` whose metrics on `dataset` are not stored."""
    stored = {(row.old_version_id, row.new_version_id)
              for row in pair_metrics_among(session=session, versions=versions, dataset=dataset)}
    return [(old, new) for old, new in permutations(versions, 2)
            if (old.id, new.id) not in stored]


def _open_metrics_jobs(session: Session, dataset: Dataset) -> dict[tuple[int, int], int]:
    """The ids of the open metrics jobs on `dataset`, by (old version id, new version id)."""
    statement = select(Job).where(Job.kind == JobKind.METRICS, Job.state.in_(OPEN_STATES))
    return {(job.params["old_version_id"], job.params["new_version_id"]): job.id
            for job in session.scalars(statement.order_by(Job.id.desc()))
            if job.params.get("evalset") == dataset.name}
