"""Storing and reading the logits of a version on a data set, and queueing the inference jobs
that compute missing ones."""

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from flipgate.compare import ReadAs
from flipgate.compare_multilabel import npy_label_scores
from flipgate.formats.evalsets import load_evalset
from flipgate.formats.logits import check_logits_head, load_logits
from flipgate.inference import MultiLabelOnnx, OnnxClassifier, Progress
from flipgate.labels import load_predicted_labels
from flipgate.logits_scan import LogitsScan
from flipgate.metrics import predicted_classes
from flipgate.metrics.chunks import chunk_rows, release, row_chunks, sample_ranges
from flipgate.metrics.multilabel import predicted_labels
from flipgate.scores import PROBABILITIES, to_logits
from flipgate.traffic import class_name_list
from service.datasets.models import Dataset, DatasetRole
from service.db import insert_or_conflict, one_or_not_found
from service.errors import Conflict, InvalidInput, library_input
from service.jobs.enqueue import queue_job
from service.jobs.models import Job, JobKind
from service.predictions.models import Prediction, PredictionSource
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import check_evalset_fits, qualified_name
from service.storage import ArtifactStore, StagedFile, file_sha256


def _prediction_row(*, session: Session, version: ModelVersion, dataset: Dataset,
                    sha256: str | None, source: PredictionSource, provider: str | None = None,
                    classes_sha256: str | None = None) -> Prediction:
    """The row pointing at logits `sha256` (None: labels only, `classes_sha256`): inserted,
    or the existing one when it points at the same predictions (others are a Conflict)."""
    existing = session.scalars(_prediction_of(version, dataset)).one_or_none()
    clash = f"version {version.id} already has other predictions on data set {dataset.name!r}"
    if existing is None:
        row = Prediction(version=version, dataset=dataset, logits_sha256=sha256,
                         classes_sha256=classes_sha256, source=source, provider=provider)
        return insert_or_conflict(session, row, code="predictions_exist", message=clash)
    if existing.logits_sha256 != sha256 or (
            classes_sha256 is not None and existing.classes_sha256 != classes_sha256):
        raise Conflict("predictions_exist", clash)
    return existing


def store_labels_file(*, session: Session, store: ArtifactStore, version: ModelVersion,
                      dataset: Dataset, npy_path: Path, name: str) -> Prediction:
    """Keep a version's uploaded predicted labels (N,) on a data set, with no logits: integers,
    or class names mapped by the line's `class_names`; the same labels again change nothing."""
    class_names = session.get_one(ModelLine, version.line_id).class_names
    with library_input():
        classes = load_predicted_labels(npy_path, num_classes=version.num_classes,
                                        class_names=class_names, source=name)
    if classes.shape != (dataset.n,):
        raise InvalidInput("labels_shape", f"{name}: {classes.size} predicted labels for data "
                           f"set {dataset.name!r} of {dataset.n} samples")
    return _prediction_row(session=session, version=version, dataset=dataset, sha256=None,
                           source=PredictionSource.UPLOADED,
                           classes_sha256=store_array(store=store, array=classes))


def store_label_predictions(*, session: Session, store: ArtifactStore, version: ModelVersion,
                            dataset: Dataset, npy_path: Path, name: str,
                            scores: str | None) -> Prediction:
    """Keep a multi-label version's uploaded .npy on a multi-label set of its line's shape:
    float scores (N, L) (logits, or probabilities when `scores` says so), kept as float64
    probabilities with their decisions at the version's thresholds beside them, or 0/1
    decisions (N, L) alone (labels only)."""
    check_evalset_fits(line=session.get_one(ModelLine, version.line_id), dataset=dataset)
    with library_input():
        read = npy_label_scores(npy_path, (dataset.n, version.num_classes),
                                ReadAs(scores=scores), source=name)
    if read.probabilities is None:
        return _prediction_row(session=session, version=version, dataset=dataset, sha256=None,
                               source=PredictionSource.UPLOADED,
                               classes_sha256=store_array(store=store, array=read.decisions))
    checked = label_probabilities_file(read.probabilities, version=version,
                                       path=npy_path.with_name("probabilities.npy"))
    return store_logits_file(session=session, store=store, version=version, dataset=dataset,
                             logits=checked, source=PredictionSource.UPLOADED)


def label_probabilities_file(probabilities: np.ndarray, *, version: ModelVersion,
                             path: Path) -> "LogitsFile":
    """A multi-label version's probabilities (N, L) written to the .npy `path` as float64
    (what `flipgate compare` measures), with its decisions at its thresholds."""
    np.save(path, np.ascontiguousarray(probabilities, dtype=np.float64), allow_pickle=False)
    return LogitsFile(StagedFile(path, file_sha256(path)),
                      predicted_labels(probabilities, version.thresholds))


def store_array(*, store: ArtifactStore, array: np.ndarray) -> str:
    """Keep an array held in memory as an .npy artifact; its sha256."""
    return store.put_stream(io.BytesIO(_npy_bytes(array))).sha256


def _with_classes(store: ArtifactStore, row: Prediction, classes: np.ndarray) -> Prediction:
    """The row, given the artifact of its predicted `classes` unless it has one."""
    if row.classes_sha256 is None:
        row.classes_sha256 = store_array(store=store, array=classes)
    return row


def predicted_classes_artifact(*, store: ArtifactStore, prediction: Prediction) -> str:
    """The address of a prediction's predicted classes: its own, or (a row stored before
    they were kept) one stored now from its logits. Needs no session."""
    return prediction.classes_sha256 or store_array(
        store=store, array=predicted_classes(read_logits(store=store, prediction=prediction)))


def read_predicted_classes(*, store: ArtifactStore, prediction: Prediction) -> np.ndarray:
    """The (N,) predicted classes of a prediction, in the smallest unsigned dtype that holds
    its classes (computed from its memory-mapped logits when the row has none stored)."""
    if prediction.classes_sha256 is None:
        return predicted_classes(read_logits(store=store, prediction=prediction))
    return read_classes_artifact(store=store, sha256=prediction.classes_sha256)


def read_classes_artifact(*, store: ArtifactStore, sha256: str) -> np.ndarray:
    """The predicted classes stored as the artifact `sha256`, memory-mapped (read-only)."""
    return np.load(store.local_path(sha256), mmap_mode="r", allow_pickle=False)


def give_classes(*, session: Session, predictions: list[Prediction],
                 classes: list[str]) -> None:
    """Point the rows of `predictions` (read in an earlier transaction) that have no predicted
    classes yet at the artifacts `classes` (`predicted_classes_artifact`), in this one."""
    for prediction, sha256 in zip(predictions, classes, strict=True):
        row = session.get_one(Prediction, prediction.id)
        row.classes_sha256 = row.classes_sha256 or sha256


def score_version(*, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                  progress: Progress | None = None) -> tuple[np.ndarray, str]:
    """A version's logits on a data set, computed in memory with ONNX Runtime, and the
    provider used."""
    with library_input():
        classifier, inputs = _scoring(store, version, dataset)
        return classifier.predict(inputs, progress=progress), classifier.provider


def score_version_to_file(*, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                          path: Path, progress: Progress | None = None,
                          rows: slice = slice(None)) -> str:
    """Write a version's logits on a data set (on its samples `rows` only, when given) to the
    .npy `path` batch by batch, reading the samples memory-mapped; the provider used."""
    with library_input():
        classifier, inputs = _scoring(store, version, dataset)
        classifier.predict_to_file({name: array[rows] for name, array in inputs.items()}, path,
                                   progress=progress)
        return classifier.provider


def score_to_checked_file(*, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                          path: Path, progress: Progress | None = None,
                          ) -> tuple["LogitsFile", str]:
    """A version's scores on a whole data set written to `path` and checked, and the
    provider used: logits, or on a multi-label set its probabilities and decisions."""
    if dataset.multilabel:
        return score_labels_to_file(store=store, version=version, dataset=dataset, path=path,
                                    progress=progress)
    provider = score_version_to_file(store=store, version=version, dataset=dataset, path=path,
                                     progress=progress)
    return check_logits_file(version=version, dataset=dataset, npy_path=path), provider


def score_labels_to_file(*, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                         path: Path, progress: Progress | None = None,
                         ) -> tuple["LogitsFile", str]:
    """A multi-label version's probabilities on a multi-label set, written to `path` with
    their decisions; the provider used."""
    probabilities, provider = score_label_probabilities(store=store, version=version,
                                                        dataset=dataset, progress=progress)
    return label_probabilities_file(probabilities, version=version, path=path), provider


def score_label_probabilities(*, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                              progress: Progress | None = None) -> tuple[np.ndarray, str]:
    """A multi-label version's probabilities (N, L) on a multi-label set (its ONNX model read
    with one score per label, as at registration), in memory, and the provider used."""
    with library_input():
        model = MultiLabelOnnx(store.model_path(version.artifact_sha256),
                               output=version.scores_output, scores=version.scores_kind)
        evalset = model.check_evalset(load_evalset(store.local_path(dataset.sha256), mmap=True,
                                                   multilabel=True))
        return model.predict(model.feeds(evalset), progress=progress), model.provider


def _scoring(store: ArtifactStore, version: ModelVersion,
             dataset: Dataset) -> tuple[OnnxClassifier, dict[str, np.ndarray]]:
    """The version's classifier (reading the scores output chosen at registration) and the
    data set's array for each of its inputs (memory-mapped), checked to fit."""
    classifier = OnnxClassifier(store.model_path(version.artifact_sha256),
                                output=version.scores_output, scores=version.scores_kind)
    evalset = load_evalset(store.local_path(dataset.sha256), mmap=True)
    classifier.check_evalset(evalset)
    return classifier, classifier.feeds(evalset)


@dataclass(frozen=True, eq=False)
class LogitsFile:
    """An .npy of logits checked to fit a version on a data set: where it is (a local file,
    or a staging object of the store) with its sha256, and its predicted classes."""

    staged: StagedFile
    classes: np.ndarray

    @property
    def sha256(self) -> str:
        return self.staged.sha256


def check_logits_file(*, version: ModelVersion, dataset: Dataset, npy_path: Path,
                      name: str | None = None, sha256: str | None = None,
                      scan: LogitsScan | None = None) -> LogitsFile:
    """Check logits written to an .npy file (uploaded, or by an inference job) memory-mapped,
    chunk by chunk, and take their digest and predicted classes, unless `sha256` and `scan`
    took them as the file was written (then only its header is read); needs no session (a
    job does it outside any transaction). Messages name the file `name`."""
    scanned = scan.result() if scan is not None else None
    with library_input():
        logits = load_logits(npy_path, mmap=True, source=name,
                             non_finite=None if scanned is None else scanned[0])
    _check_shape(logits.shape, version, dataset)
    classes = predicted_classes(logits) if scanned is None else scanned[1]
    return LogitsFile(StagedFile(npy_path, sha256 or file_sha256(npy_path)), classes)


def check_streamed_logits(*, version: ModelVersion, dataset: Dataset, staged: StagedFile,
                          name: str) -> LogitsFile:
    """`check_logits_file` for logits streamed into the store: from the scan taken as they
    arrived, their head and their size (never read again). A file the scan gave up on
    (not plain C-ordered (N, C) floats) is refused with the header's own reason."""
    scanned = staged.scan.result()
    with library_input():
        shape = check_logits_head(staged.head, staged.size, source=name,
                                  non_finite=0 if scanned is None else scanned[0])
    if scanned is None:
        raise InvalidInput("logits_layout", f"{name}: logits must be a C-ordered (N, C) "
                           "float array (a Fortran-ordered one is refused when streamed)")
    _check_shape(shape, version, dataset)
    return LogitsFile(staged, scanned[1])


def logits_of_probabilities(path: Path, *, name: str) -> Path:
    """Write the (N, C) probabilities of the .npy `path` as float32 logits (their floored
    logs, flipgate.scores) to a file beside it, a chunk of rows at a time; that file."""
    with library_input():
        probabilities = load_logits(path, mmap=True, source=name)
        out = path.with_name(f"{path.stem}-as-logits.npy")
        with out.open("wb") as file:
            np.lib.format.write_array_header_2_0(file, _float32_header(probabilities.shape))
            for chunk in row_chunks(probabilities):
                file.write(to_logits(chunk, PROBABILITIES, source=name).astype("<f4").tobytes())
    return out


def _float32_header(shape: tuple[int, ...]) -> dict:
    """The .npy header of a C-ordered little-endian float32 array of `shape`."""
    return {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False,
            "shape": shape}


def store_logits_file(*, session: Session, store: ArtifactStore, version: ModelVersion,
                      dataset: Dataset, logits: LogitsFile, source: PredictionSource,
                      provider: str | None = None) -> Prediction:
    """Keep checked logits: their row, then the file stored as it is (linked into the local
    store, no copy; a staging object copied to its address) and their predicted classes
    beside it."""
    row = _prediction_row(session=session, version=version, dataset=dataset,
                          sha256=logits.sha256, source=source, provider=provider)
    store.put_staged(logits.staged)
    return _with_classes(store, row, logits.classes)


def concatenate_logits(parts: list[np.ndarray], path: Path) -> None:
    """Write the (n_i, C) logits `parts` (memory-mapped), in order, as one float32 .npy at
    `path`, a chunk at a time."""
    rows, columns = sum(part.shape[0] for part in parts), parts[0].shape[1]
    with path.open("wb") as file:
        np.lib.format.write_array_header_2_0(file, _float32_header((rows, columns)))
        for part in parts:
            for start, stop in sample_ranges(part.shape[0], chunk_rows(columns)):
                file.write(np.ascontiguousarray(part[start:stop], dtype="<f4").tobytes())
                release(part, start, stop)


def _check_shape(shape: tuple[int, ...], version: ModelVersion, dataset: Dataset) -> None:
    """One row of logits per sample and one column per class of the version (and at least
    as many as the data set's labels name; a traffic set's class count may be unknown)."""
    expected = (dataset.n, version.num_classes)
    if tuple(shape) != expected or (dataset.num_classes or 0) > version.num_classes:
        raise InvalidInput("logits_shape", f"logits of shape {tuple(shape)} do not fit data "
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


def read_logits_artifact(*, store: ArtifactStore, sha256: str) -> np.ndarray:
    """The logits array stored as the artifact `sha256`, memory-mapped (read-only)."""
    return np.load(store.local_path(sha256), mmap_mode="r", allow_pickle=False)


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
    `dataset` that has a model file; none when all have them."""
    present = versions_with_predictions(session=session, versions=versions, dataset=dataset)
    return [queue_job(session=session, kind=JobKind.INFERENCE, params={
                "version_id": version.id, "dataset_id": dataset.id, "evalset": dataset.name,
                "version": qualified_name(session=session, version=version)})
            for version in versions if version not in present and not version.external]


def measured_datasets(*, session: Session, line_id: int) -> list[Dataset]:
    """The eval sets on which some version of the line has logits."""
    measured = (select(Prediction.dataset_id)
                .join(ModelVersion, ModelVersion.id == Prediction.version_id)
                .where(ModelVersion.line_id == line_id))
    return list(session.scalars(select(Dataset).where(
        Dataset.id.in_(measured), Dataset.role == DatasetRole.EVAL).order_by(Dataset.id)))


def measured_class_names(*, session: Session, dataset: Dataset) -> list[str] | None:
    """The names the set's exports give the classes (a line's class names, else its column
    numbers as strings), when every line with predictions on the set names them alike;
    None otherwise."""
    lines = session.scalars(select(ModelLine).where(ModelLine.id.in_(
        select(ModelVersion.line_id).join(Prediction, Prediction.version_id == ModelVersion.id)
        .where(Prediction.dataset_id == dataset.id)))).all()
    named = {tuple(class_name_list(line.num_classes, line.class_names)) for line in lines}
    return list(named.pop()) if len(named) == 1 else None
