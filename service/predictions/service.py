"""Storing and reading the logits of a version on a data set, and queueing the inference jobs
that compute missing ones."""

import io
from pathlib import Path

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from flipgate.formats import load_evalset, load_logits, validate_logits
from flipgate.inference import OnnxClassifier, Progress
from service.artifacts import ArtifactStore, file_sha256
from service.datasets.models import Dataset, DatasetRole
from service.db import insert_or_conflict, one_or_not_found
from service.errors import Conflict, InvalidInput, library_input
from service.jobs.enqueue import queue_job
from service.jobs.models import Job, JobKind
from service.predictions.models import Prediction, PredictionSource
from service.registry.models import ModelVersion
from service.registry.service import qualified_name


def store_predictions(
    *, session: Session, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
    logits: np.ndarray, source: PredictionSource, provider: str | None = None,
) -> Prediction:
    """Keep a version's logits on a data set; the same logits again change nothing."""
    with library_input():
        validate_logits(logits, source=f"logits of version {version.id}")
    _check_shape(logits, version, dataset)
    sha256 = store_logits(store=store, logits=logits)
    return _prediction_row(session=session, version=version, dataset=dataset, sha256=sha256,
                           source=source, provider=provider)


def _prediction_row(*, session: Session, version: ModelVersion, dataset: Dataset, sha256: str,
                    source: PredictionSource, provider: str | None = None) -> Prediction:
    """The row pointing at logits `sha256`: inserted, or the existing one when it points at
    the same logits (other logits are a Conflict)."""
    existing = session.scalars(_prediction_of(version, dataset)).one_or_none()
    clash = f"version {version.id} already has other logits on data set {dataset.name!r}"
    if existing is None:
        row = Prediction(version=version, dataset=dataset, logits_sha256=sha256,
                         source=source, provider=provider)
        return insert_or_conflict(session, row, code="predictions_exist", message=clash)
    if existing.logits_sha256 != sha256:
        raise Conflict("predictions_exist", clash)
    return existing


def store_logits(*, store: ArtifactStore, logits: np.ndarray) -> str:
    """Keep a logits array as an .npy artifact; its sha256."""
    return store.put_stream(io.BytesIO(_npy_bytes(logits))).sha256


def score_version(*, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                  progress: Progress | None = None,
                  rows: slice = slice(None)) -> tuple[np.ndarray, str]:
    """A version's logits on a data set (on its samples `rows` only, when given), computed
    with ONNX Runtime, and the provider used."""
    with library_input():
        classifier = OnnxClassifier(store.path(version.artifact_sha256))
        evalset = load_evalset(store.path(dataset.sha256), mmap=True)
        classifier.check_evalset(evalset)
        return classifier.predict(evalset.x[rows], progress=progress), classifier.provider


def store_uploaded_logits(*, session: Session, store: ArtifactStore, version: ModelVersion,
                          dataset: Dataset, npy_path: Path, source: str | None = None,
                          ) -> Prediction:
    """Keep logits that a team computed itself: the uploaded .npy is checked memory-mapped,
    chunk by chunk, and enters the store as it is once its row is in."""
    with library_input():
        logits = load_logits(npy_path, mmap=True, source=source)
    _check_shape(logits, version, dataset)
    row = _prediction_row(session=session, version=version, dataset=dataset,
                          sha256=file_sha256(npy_path), source=PredictionSource.UPLOADED)
    store.put_file(npy_path, row.logits_sha256)
    return row


def _check_shape(logits: np.ndarray, version: ModelVersion, dataset: Dataset) -> None:
    """One row of logits per sample and one column per class of the version."""
    expected = (dataset.n, version.num_classes)
    if logits.shape != expected or dataset.num_classes > version.num_classes:
        raise InvalidInput("logits_shape", f"logits of shape {logits.shape} do not fit data "
                           f"set {dataset.name!r} ({dataset.n} samples, labels < "
                           f"{dataset.num_classes}) and a model of {version.num_classes} classes")


def _npy_bytes(logits: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(logits), allow_pickle=False)
    return buffer.getvalue()


def _prediction_of(version: ModelVersion, dataset: Dataset) -> Select[tuple[Prediction]]:
    return select(Prediction).where(Prediction.version_id == version.id,
                                    Prediction.dataset_id == dataset.id)


def get_predictions(*, session: Session, version: ModelVersion, dataset: Dataset) -> Prediction:
    """The stored predictions of `version` on `dataset`."""
    return one_or_not_found(session, _prediction_of(version, dataset),
                            code="predictions_not_found", message=f"version {version.id} "
                            f"has no logits on data set {dataset.name!r}")


def read_logits(*, store: ArtifactStore, prediction: Prediction) -> np.ndarray:
    """The (N, C) logits array a prediction points at."""
    return read_logits_artifact(store=store, sha256=prediction.logits_sha256)


def read_predicted_classes(*, store: ArtifactStore, prediction: Prediction) -> np.ndarray:
    """The predicted class of each sample (the argmax of the stored logits)."""
    return read_logits(store=store, prediction=prediction).argmax(axis=1)


def read_logits_artifact(*, store: ArtifactStore, sha256: str) -> np.ndarray:
    """The logits array stored as the artifact `sha256`."""
    with store.open(sha256) as readable:
        return np.load(readable, allow_pickle=False)


def versions_with_predictions(*, session: Session, versions: list[ModelVersion],
                              dataset: Dataset) -> list[ModelVersion]:
    """Those of `versions`, in their order, that have logits on `dataset`."""
    statement = select(Prediction.version_id).where(
        Prediction.dataset_id == dataset.id,
        Prediction.version_id.in_([version.id for version in versions]))
    present = set(session.scalars(statement))
    return [version for version in versions if version.id in present]


def queue_missing_inference(*, session: Session, versions: list[ModelVersion],
                            dataset: Dataset) -> list[Job]:
    """An inference job (the open one, or a new one) for each version without logits on
    `dataset`; none when all have them."""
    present = versions_with_predictions(session=session, versions=versions, dataset=dataset)
    return [queue_job(session=session, kind=JobKind.INFERENCE, params={
                "version_id": version.id, "dataset_id": dataset.id, "evalset": dataset.name,
                "version": qualified_name(session=session, version=version)})
            for version in versions if version not in present]


def measured_datasets(*, session: Session, line_id: int) -> list[Dataset]:
    """The eval sets on which some version of the line has logits."""
    measured = (select(Prediction.dataset_id)
                .join(ModelVersion, ModelVersion.id == Prediction.version_id)
                .where(ModelVersion.line_id == line_id))
    return list(session.scalars(select(Dataset).where(
        Dataset.id.in_(measured), Dataset.role == DatasetRole.EVAL).order_by(Dataset.id)))
