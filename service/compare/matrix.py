"""A line's pairwise matrix on an eval set, from stored pair counts: reading it, queueing the
matrix job that stores the missing counts, and what that job computes from the versions'
predicted classes (never from their logits). A request never computes a cell."""

from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from flipgate.metrics import label_pair_count_matrices, pair_count_matrices
from service.compare.models import PairCounts
from service.compare.schemas import MissingPair, PairMatrix
from service.datasets.models import Dataset
from service.datasets.service import get_dataset, read_label_matrix, read_labels
from service.db import insert_or_conflict
from service.errors import Conflict
from service.jobs.enqueue import create_job
from service.jobs.models import Job, JobKind, JobState
from service.jobs.service import find_open_job
from service.predictions.models import Prediction
from service.predictions.service import (
    predicted_classes_artifact,
    read_classes_artifact,
    versions_with_predictions,
)
from service.registry.models import ModelVersion
from service.registry.service import get_line, list_versions
from service.storage import ArtifactStore

PairKey = tuple[int, int]  # (lower version id, higher version id)


def line_matrix(*, session: Session, line_name: str, dataset: Dataset) -> PairMatrix:
    """NFR, PFR and churn of every ordered pair of the line's versions that have logits on
    `dataset`, from the stored pair counts (churn only on a traffic set: NFR and PFR are
    None; per sample on a multi-label set: NFR_sample, PFR_sample, churn_sample); the pairs
    not stored are listed with the open matrix job (None when none is
    open)."""
    versions = versions_with_logits(session=session, line_name=line_name, dataset=dataset)
    stored = pair_counts_among(session=session, versions=versions, dataset=dataset)
    params = matrix_params(line_name, dataset)
    job = (_queued_job(session, params)
           or find_open_job(session=session, kind=JobKind.MATRIX, params=params))
    matrices: dict[str, list[list[float | None]]] = {
        name: [[0.0 if old.id == new.id else None for new in versions] for old in versions]
        for name in ("nfr", "pfr", "churn")}
    missing = []
    for (i, old), (j, new) in permutations(enumerate(versions), 2):
        row = stored.get(pair_key(old.id, new.id))
        if row is None:
            missing.append(MissingPair(old=old.version, new=new.version,
                                       job_id=None if job is None else job.id))
            continue
        for name, rate in row.rates(old.id).items():
            matrices[name][i][j] = rate if dataset.labeled or name == "churn" else None
    return PairMatrix(versions=[version.version for version in versions], missing=missing,
                      multilabel=dataset.multilabel, **matrices)


def queue_matrix(*, session: Session, line_name: str, dataset: Dataset) -> Job | None:
    """The matrix job of the line on `dataset` when some pair of its versions with logits
    there has no stored counts: the queued one, else a new one (a running job may have read
    its versions before the newest logits were stored); None when the matrix is complete."""
    versions = versions_with_logits(session=session, line_name=line_name, dataset=dataset)
    if not missing_pairs(session=session, versions=versions, dataset=dataset):
        return None
    params = matrix_params(line_name, dataset)
    return (_queued_job(session, params)
            or create_job(session=session, kind=JobKind.MATRIX, params=params))


def _queued_job(session: Session, params: dict[str, Any]) -> Job | None:
    """The matrix job with `params` that no worker has taken yet, if any."""
    return find_open_job(session=session, kind=JobKind.MATRIX, params=params,
                         states=[JobState.QUEUED])


def matrix_params(line_name: str, dataset: Dataset) -> dict[str, Any]:
    """The params of the matrix job of a line on a data set: one open job per line and set,
    which covers the versions that have logits there when it runs."""
    return {"line": line_name, "evalset": dataset.name}


def versions_with_logits(*, session: Session, line_name: str,
                         dataset: Dataset) -> list[ModelVersion]:
    """The line's versions, oldest first, that have logits on `dataset`."""
    return versions_with_predictions(session=session, dataset=dataset, versions=list_versions(
        session=session, line_name=line_name))


def pair_key(first_id: int, second_id: int) -> PairKey:
    """The two version ids, the lower first (as a pair_counts row holds them)."""
    return (min(first_id, second_id), max(first_id, second_id))


def pair_counts_among(*, session: Session, versions: list[ModelVersion],
                      dataset: Dataset) -> dict[PairKey, PairCounts]:
    """The stored counts of the pairs of `versions` on `dataset`, by pair_key."""
    ids = [version.id for version in versions]
    rows = session.scalars(select(PairCounts).where(
        PairCounts.dataset_id == dataset.id, PairCounts.first_version_id.in_(ids),
        PairCounts.second_version_id.in_(ids)))
    return {(row.first_version_id, row.second_version_id): row for row in rows}


def missing_pairs(*, session: Session, versions: list[ModelVersion],
                  dataset: Dataset) -> list[PairKey]:
    """The unordered pairs of `versions` whose counts on `dataset` are not stored."""
    stored = pair_counts_among(session=session, versions=versions, dataset=dataset)
    return [key for key in (pair_key(first.id, second.id)
                            for first, second in combinations(versions, 2))
            if key not in stored]


@dataclass(frozen=True)
class MatrixInputs:
    """The predictions of the versions that appear in a missing pair of a line's matrix, the
    data set, and those pairs; counting them needs no session (the matrix job counts outside
    any transaction)."""

    dataset: Dataset
    predictions: list[Prediction]
    pairs: list[PairKey]
    class_names: list[str] | None = None  # the line's: they map an eval set's named labels

    def classes(self, store: ArtifactStore) -> list[str]:
        """The artifacts of the predictions' classes, stored now for rows that have none."""
        return [predicted_classes_artifact(store=store, prediction=prediction)
                for prediction in self.predictions]

    def labels(self, store: ArtifactStore, predictions: list[np.ndarray]) -> np.ndarray:
        """The data set's labels; on a traffic set a class no version predicts, so that no
        sample counts as right (its matrix shows churn only)."""
        if self.dataset.labeled:
            return read_labels(store=store, dataset=self.dataset, class_names=self.class_names)
        beyond = 1 + max(int(classes.max()) for classes in predictions)
        return np.full(self.dataset.n, beyond, dtype=np.int64)

    def count(self, store: ArtifactStore, classes: list[str]) -> list[PairCounts]:
        """New rows of counts of the missing pairs, from the predicted-class artifacts
        `classes` (one per prediction; the decisions (N, L) of a multi-label set) and the
        data set's labels."""
        if not self.pairs:
            return []
        predictions = [read_classes_artifact(store=store, sha256=sha256) for sha256 in classes]
        if self.dataset.multilabel:
            labels = (read_label_matrix(store=store, dataset=self.dataset)
                      if self.dataset.labeled else np.zeros(predictions[0].shape, bool))
            counts = label_pair_count_matrices(predictions, labels)  # traffic: churn only
        else:
            counts = pair_count_matrices(predictions, self.labels(store, predictions))
        index = {prediction.version_id: position
                 for position, prediction in enumerate(self.predictions)}
        return [PairCounts(first_version_id=first, second_version_id=second,
                           dataset_id=self.dataset.id, n=counts.n,
                           only_first_right=int(counts.only_right[index[first], index[second]]),
                           only_second_right=int(counts.only_right[index[second], index[first]]),
                           differ=int(counts.differ[index[first], index[second]]))
                for first, second in self.pairs]


def matrix_inputs(*, session: Session, params: dict[str, Any]) -> MatrixInputs:
    """What the matrix job with `params` counts: the pairs missing now."""
    dataset = get_dataset(session=session, name=params["evalset"])
    versions = versions_with_logits(session=session, line_name=params["line"], dataset=dataset)
    pairs = missing_pairs(session=session, versions=versions, dataset=dataset)
    involved = {version_id for pair in pairs for version_id in pair}
    predictions = session.scalars(select(Prediction).where(
        Prediction.dataset_id == dataset.id, Prediction.version_id.in_(involved))
        .order_by(Prediction.version_id))
    line = get_line(session=session, name=params["line"])
    return MatrixInputs(dataset, list(predictions), pairs, line.class_names)


def store_pair_counts(*, session: Session, rows: list[PairCounts]) -> list[PairCounts]:
    """Insert the rows whose pair is not stored yet, each in its own savepoint: a pair that
    a job run twice, or another matrix job, stored meanwhile is kept as it is. The rows
    inserted."""
    ids = {version_id for row in rows for version_id in (row.first_version_id,
                                                           row.second_version_id)}
    stored = set(session.execute(select(
        PairCounts.first_version_id, PairCounts.second_version_id, PairCounts.dataset_id).where(
        PairCounts.first_version_id.in_(ids), PairCounts.second_version_id.in_(ids))).all())
    return [row for row in rows
            if (row.first_version_id, row.second_version_id, row.dataset_id) not in stored
            and _inserted(session, row)]


def _inserted(session: Session, row: PairCounts) -> bool:
    """Whether `row` was inserted (False: another transaction stored its pair first)."""
    try:
        insert_or_conflict(session, row, code="pair_counts_exist", message="stored meanwhile")
    except Conflict:
        return False
    return True
