"""Storing compare reports and reading them back as a line's pairwise matrices."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import permutations
from typing import Any

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from flipgate.metrics import compare_logits
from flipgate.metrics.report import PairAnalysis
from flipgate.reporting.html import render_html
from service.artifacts import ArtifactStore
from service.compare.models import REPORT_SCALARS, PairMetrics
from service.compare.schemas import PairMatrix
from service.datasets.models import Dataset
from service.datasets.service import get_dataset, read_labels
from service.db import insert_or_conflict
from service.errors import InvalidInput
from service.predictions.service import get_predictions, read_logits, versions_with_predictions
from service.registry.models import ModelVersion
from service.registry.service import list_versions, qualified_name, resolve_reference

MATRIX_METRICS = ("nfr", "pfr", "churn")


@dataclass(frozen=True)
class Pair:
    """An old and a new version and the data set they are compared on."""

    old: ModelVersion
    new: ModelVersion
    dataset: Dataset


def store_pair_metrics(*, session: Session, old: ModelVersion, new: ModelVersion,
                       dataset: Dataset, report: dict[str, Any]) -> PairMetrics:
    """Keep a `compare_logits` report of old → new on a data set; a stored triple is returned."""
    _check_report(old, new, dataset, report)
    existing = find_pair_metrics(session=session, old=old, new=new, dataset=dataset)
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


def pair_report(*, session: Session, store: ArtifactStore, pair: Pair) -> dict[str, Any]:
    """The pair's report with the keys of `flipgate compare --json`, stored on first request."""
    report = _stored_report(session, pair, lambda: _analysis(session, store, pair))
    return {**report, **_sources(session, pair)}


def pair_html(*, session: Session, store: ArtifactStore, pair: Pair) -> str:
    """The pair's self-contained HTML report, storing its metrics on first request."""
    analysis, sources = _analysis(session, store, pair), _sources(session, pair)
    report = {**_stored_report(session, pair, lambda: analysis), **sources}
    return render_html(analysis, report, old_name=sources["old"]["source"],
                       new_name=sources["new"]["source"])


def _stored_report(session: Session, pair: Pair,
                   analyse: Callable[[], PairAnalysis]) -> dict[str, Any]:
    """The stored report of the pair, or the one `analyse` computes, stored now."""
    stored = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
    if stored is None:
        stored = store_pair_metrics(session=session, old=pair.old, new=pair.new,
                                    dataset=pair.dataset, report=analyse().to_dict())
    return stored.report


def _analysis(session: Session, store: ArtifactStore, pair: Pair) -> PairAnalysis:
    """The per-sample comparison of the pair's stored logits."""
    logits = _logits_reader(session, store, pair.dataset)
    return PairAnalysis(logits(pair.old), logits(pair.new),
                        read_labels(store=store, dataset=pair.dataset))


def _logits_reader(session: Session, store: ArtifactStore,
                   dataset: Dataset) -> Callable[[ModelVersion], np.ndarray]:
    """A function that reads (once per version) a version's logits on `dataset`."""

    @cache
    def logits(version: ModelVersion) -> np.ndarray:
        prediction = get_predictions(session=session, version=version, dataset=dataset)
        return read_logits(store=store, prediction=prediction)

    return logits


def _sources(session: Session, pair: Pair) -> dict[str, dict[str, str]]:
    """The "old" and "new" entries of the report."""
    return {"old": _source(session, pair.old, pair.dataset),
            "new": _source(session, pair.new, pair.dataset)}


def _source(session: Session, version: ModelVersion, dataset: Dataset) -> dict[str, str]:
    """Which version was scored, and by what (an execution provider, or "uploaded")."""
    prediction = get_predictions(session=session, version=version, dataset=dataset)
    return {"source": qualified_name(session=session, version=version),
            "provider": prediction.provider or prediction.source.value}


def complete_matrix(*, session: Session, store: ArtifactStore, line_name: str,
                    dataset: Dataset) -> PairMatrix:
    """The matrix over the line's versions that have logits on `dataset`; pairs not yet
    stored are computed and stored now."""
    versions = versions_with_predictions(
        session=session, dataset=dataset, versions=list_versions(session=session,
                                                                 line_name=line_name))
    stored = {(row.old_version_id, row.new_version_id)
              for row in pair_metrics_among(session=session, versions=versions, dataset=dataset)}
    missing = [(old, new) for old, new in permutations(versions, 2)
               if (old.id, new.id) not in stored]
    if missing:
        _store_pairs(session, store, dataset, missing)
    return versions_matrix(session=session, versions=versions, dataset=dataset)


def _store_pairs(session: Session, store: ArtifactStore, dataset: Dataset,
                 pairs: list[tuple[ModelVersion, ModelVersion]]) -> None:
    """Compute and store the compare report of each (old, new) pair on `dataset`."""
    logits, labels = _logits_reader(session, store, dataset), read_labels(store=store,
                                                                         dataset=dataset)
    for old, new in pairs:
        store_pair_metrics(session=session, old=old, new=new, dataset=dataset,
                           report=compare_logits(logits(old), logits(new), labels))
