"""Storing compare reports and reading them back as a line's pairwise matrices."""

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from service.compare.models import REPORT_SCALARS, PairMetrics
from service.compare.schemas import PairMatrix
from service.db import insert_or_conflict
from service.errors import InvalidInput
from service.evalsets.models import Dataset
from service.models.models import ModelVersion
from service.models.service import list_versions

MATRIX_METRICS = ("nfr", "pfr", "churn")


def store_pair_metrics(*, session: Session, old: ModelVersion, new: ModelVersion,
                       dataset: Dataset, report: dict[str, Any]) -> PairMetrics:
    """Keep a `compare_logits` report of old → new on a data set; a stored triple is returned."""
    _check_report(old, new, dataset, report)
    existing = session.scalars(_pair_metrics_query([old.id], [new.id], dataset)).one_or_none()
    if existing is not None:
        return existing
    low, high = report["nfr_ci"]
    row = PairMetrics(old_version=old, new_version=new, dataset=dataset, report=report,
                      nfr_ci_low=low, nfr_ci_high=high,
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


def pair_matrix(*, session: Session, line_name: str, dataset: Dataset) -> PairMatrix:
    """NFR, PFR and churn of every ordered pair of a line's versions, from stored rows."""
    versions = list_versions(session=session, line_name=line_name)
    position = {version.id: index for index, version in enumerate(versions)}
    size = len(versions)
    matrices = {name: [[0.0 if i == j else None for j in range(size)] for i in range(size)]
                for name in MATRIX_METRICS}
    for row in pair_metrics_among(session=session, versions=versions, dataset=dataset):
        for name, matrix in matrices.items():
            matrix[position[row.old_version_id]][position[row.new_version_id]] = getattr(row, name)
    return PairMatrix(versions=[version.version for version in versions], **matrices)
