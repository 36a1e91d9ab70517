"""A line's production history on an eval set: the samples each version got right, the
candidate's breaks against any of the last k production versions, and the samples whose
correctness changed most often between consecutive production versions."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.datasets.models import Dataset
from service.datasets.service import read_labels
from service.errors import InvalidInput
from service.gate.models import Promotion
from service.gate.rules import HistoryLimit
from service.gate.schemas import UnstableSample, UnstableSamples
from service.predictions.models import Prediction
from service.predictions.service import (
    get_predictions,
    read_predicted_classes,
    versions_with_predictions,
)
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_line, get_version
from service.storage import ArtifactStore


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
    return _right(store, prediction, labels)


def _right(store: ArtifactStore, prediction: Prediction, labels: np.ndarray) -> np.ndarray:
    return read_predicted_classes(store=store, prediction=prediction) == labels


@dataclass(frozen=True)
class HistoryInputs:
    """What a candidate's breaks against the production history on an eval set are read from:
    the eval set, the earlier production versions' predictions on it and the candidate's."""

    dataset: Dataset
    earlier: tuple[tuple[str, Prediction], ...]  # (version, its predictions), newest first
    candidate: Prediction
    class_names: list[str] | None = None  # the line's: they map an eval set's named labels

    @property
    def key(self) -> tuple[int, ...]:
        """The rows it reads, by id: equal keys read equal arrays (stored rows never change)."""
        return (self.dataset.id, self.candidate.id,
                *(prediction.id for _, prediction in self.earlier))

    def breaks(self, store: ArtifactStore) -> dict[str, Any]:
        """The share of the eval set that some earlier version got right and the candidate
        gets wrong, read from the stored arrays (no database)."""
        labels = read_labels(store=store, dataset=self.dataset, class_names=self.class_names)
        right_before = np.zeros(labels.shape, dtype=bool)
        for _, prediction in self.earlier:
            right_before |= _right(store, prediction, labels)
        broken = right_before & ~_right(store, self.candidate, labels)
        return {"history_nfr": int(broken.sum()) / labels.size if self.earlier else None,
                "history_broken": int(broken.sum()),
                "history_versions": [version for version, _ in self.earlier]}


def history_inputs(*, session: Session, line: ModelLine, candidate: ModelVersion,
                   dataset: Dataset, limit: HistoryLimit,
                   before: datetime | None = None) -> HistoryInputs:
    """The inputs of the candidate's breaks against the last `limit.versions` production
    versions (those with predictions on `dataset`; `before`: the history as it was then)."""
    earlier = [version for version in production_history(session=session, line=line,
                                                         before=before)
               if version.id != candidate.id]
    recent = list({version.id: version for version in reversed(earlier)}.values())
    measured = versions_with_predictions(session=session, dataset=dataset,
                                         versions=recent[:limit.versions])
    return HistoryInputs(dataset, tuple(
        (version.version, get_predictions(session=session, version=version, dataset=dataset))
        for version in measured), get_predictions(session=session, version=candidate,
                                                  dataset=dataset), line.class_names)


def unstable_samples(*, session: Session, store: ArtifactStore, line_name: str,
                     dataset: Dataset, limit: int) -> UnstableSamples:
    """Per sample, how often its correctness changed between consecutive production versions
    (those with predictions on `dataset`), most unstable first; single-label lines only
    (`unstable_samples_not_multilabel`)."""
    line = get_line(session=session, name=line_name)
    if line.multilabel:
        raise InvalidInput("unstable_samples_not_multilabel", f"model line {line_name!r} is "
                           "multi-label: unstable samples are counted on single-label lines "
                           "only so far")
    history = production_history(session=session, line=line)
    versions = versions_with_predictions(session=session, dataset=dataset, versions=history)
    labels = read_labels(store=store, dataset=dataset, class_names=line.class_names)
    correct = np.array([_correct(session, store, version, dataset, labels)
                        for version in versions]).reshape(len(versions), labels.size)
    changes = np.count_nonzero(np.diff(correct, axis=0), axis=0)
    order = np.lexsort((np.arange(labels.size), -changes))
    samples = [UnstableSample(index=int(index), changes=int(changes[index]),
                              label=int(labels[index]), correct=correct[:, index].tolist())
               for index in order[:limit] if changes[index] > 0]
    return UnstableSamples(model=line.name, evalset=dataset.name,
                           versions=[version.version for version in versions], samples=samples)
