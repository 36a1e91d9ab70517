"""A line's production history on an eval set: the samples each version got right, the
candidate's breaks against any of the last k production versions, and the samples whose
correctness changed most often between consecutive production versions."""

from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.artifacts import ArtifactStore
from service.datasets.models import Dataset
from service.datasets.service import read_labels
from service.gate.models import Promotion
from service.gate.rules import HistoryLimit
from service.gate.schemas import UnstableSample, UnstableSamples
from service.predictions.service import (
    get_predictions,
    read_predicted_classes,
    versions_with_predictions,
)
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_line, get_version


def production_history(*, session: Session, line: ModelLine,
                       before: datetime | None = None) -> list[ModelVersion]:
    """The versions the line's production alias pointed at, oldest first (a version promoted
    again right after itself counts once); `before`: only promotions made before then."""
    statement = select(Promotion.to_version_id).where(Promotion.line_id == line.id)
    if before is not None:
        statement = statement.where(Promotion.created_at < before)
    ids = list(session.scalars(statement.order_by(Promotion.id)))
    consecutive = [version_id for index, version_id in enumerate(ids)
                   if index == 0 or ids[index - 1] != version_id]
    return [get_version(session=session, version_id=version_id) for version_id in consecutive]


def _correct(session: Session, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
             labels: np.ndarray) -> np.ndarray:
    """Which samples of `dataset` the version's stored predictions get right."""
    prediction = get_predictions(session=session, version=version, dataset=dataset)
    return read_predicted_classes(store=store, prediction=prediction) == labels


def history_breaks(*, session: Session, store: ArtifactStore, line: ModelLine,
                   candidate: ModelVersion, dataset: Dataset, limit: HistoryLimit,
                   before: datetime | None = None) -> dict[str, Any]:
    """The share of `dataset` that some of the last `limit.versions` production versions
    (with predictions on it) got right and the candidate gets wrong, and those versions."""
    earlier = [version for version in production_history(session=session, line=line,
                                                         before=before)
               if version.id != candidate.id]
    recent = list({version.id: version for version in reversed(earlier)}.values())
    measured = versions_with_predictions(session=session, dataset=dataset,
                                         versions=recent[:limit.versions])
    labels = read_labels(store=store, dataset=dataset)
    right_before = np.zeros(labels.shape, dtype=bool)
    for version in measured:
        right_before |= _correct(session, store, version, dataset, labels)
    broken = right_before & ~_correct(session, store, candidate, dataset, labels)
    return {"history_nfr": int(broken.sum()) / labels.size if measured else None,
            "history_broken": int(broken.sum()),
            "history_versions": [version.version for version in measured]}


def unstable_samples(*, session: Session, store: ArtifactStore, line_name: str,
                     dataset: Dataset, limit: int) -> UnstableSamples:
    """Per sample, how often its correctness changed between consecutive production versions
    (those with predictions on `dataset`), most unstable first."""
    line = get_line(session=session, name=line_name)
    history = production_history(session=session, line=line)
    versions = versions_with_predictions(session=session, dataset=dataset, versions=history)
    labels = read_labels(store=store, dataset=dataset)
    correct = np.array([_correct(session, store, version, dataset, labels)
                        for version in versions]).reshape(len(versions), labels.size)
    changes = np.count_nonzero(np.diff(correct, axis=0), axis=0)
    order = np.lexsort((np.arange(labels.size), -changes))
    samples = [UnstableSample(index=int(index), changes=int(changes[index]),
                              label=int(labels[index]), correct=correct[:, index].tolist())
               for index in order[:limit] if changes[index] > 0]
    return UnstableSamples(model=line.name, evalset=dataset.name,
                           versions=[version.version for version in versions], samples=samples)
