"""Labels of a traffic set, added after its registration: append-only imports, each making
a new label revision that holds every label known after it (docs/traffic.md)."""

import hashlib
import io
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from flipgate.errors import InputError
from flipgate.formats.evalsets import load_evalset
from flipgate.metrics.traffic import UNLABELLED
from flipgate.traffic import merge_labels, read_labels_file
from service.datasets.models import Dataset, DatasetLabels
from service.db import insert_or_conflict
from service.errors import Conflict, InvalidInput, library_input
from service.storage import ArtifactStore


def latest_labels(*, session: Session, dataset: Dataset) -> DatasetLabels | None:
    """The traffic set's newest label revision (None before the first import)."""
    return session.scalars(select(DatasetLabels).where(DatasetLabels.dataset_id == dataset.id)
                           .order_by(DatasetLabels.revision.desc()).limit(1)).one_or_none()


def label_revision(*, session: Session, dataset: Dataset) -> int:
    """The number of the traffic set's newest label revision: 0 before any import, and
    always for a labeled set."""
    latest = None if dataset.labeled else latest_labels(session=session, dataset=dataset)
    return 0 if latest is None else latest.revision


def get_labels(*, session: Session, dataset: Dataset, revision: int) -> DatasetLabels | None:
    """The label revision `revision` of a traffic set (None for revision 0: no labels)."""
    if revision == 0:
        return None
    return session.scalars(select(DatasetLabels).where(
        DatasetLabels.dataset_id == dataset.id, DatasetLabels.revision == revision)
    ).one_or_none()


def read_revision_labels(*, store: ArtifactStore, labels: DatasetLabels | None,
                         n: int, num_labels: int | None = None) -> np.ndarray:
    """The (N,) labels of a revision, UNLABELLED where unknown (all of them without one);
    with `num_labels`, a multi-label set's label sets (N, L), whole rows UNLABELLED."""
    if labels is None:
        return np.full(n if num_labels is None else (n, num_labels), UNLABELLED, np.int64)
    with store.open(labels.sha256) as readable:
        return np.load(io.BytesIO(readable.read()), allow_pickle=False)


def add_labels(*, session: Session, store: ArtifactStore, dataset: Dataset, labels_path: Path,
               source: str, line_class_names: list[str] | None) -> DatasetLabels | None:
    """Add the labels of a file (an .npz of `index` or `ids` and `y`, or a Label Studio
    export) to a traffic set as a new revision; None when every label was known already
    (the same label again changes nothing); on a multi-label set, label sets (a 0/1 matrix
    (N, L) per revision). Class names map to columns by the set's
    `classes`, else by `line_class_names` (the names the exports of the lines measured on it
    give the classes, column numbers for a line without names, when those lines agree).
    A different label for a labelled sample is a Conflict `label_conflict` naming it;
    nothing is stored on a refusal."""
    if dataset.labeled:
        raise InvalidInput("not_a_traffic_set", f"{dataset.name!r} has labels (`y`); labels "
                           "are added to traffic sets only")
    latest = latest_labels(session=session, dataset=dataset)
    with library_input():
        evalset = load_evalset(store.local_path(dataset.sha256), mmap=True)
        names = evalset.classes or line_class_names
        num_classes = dataset.num_classes or (len(names) if names else None)
        if dataset.multilabel and num_classes is None:
            raise InvalidInput("labels_need_line", f"{dataset.name!r} names no labels and no "
                               "measured line gives it their names; measure a pair on it "
                               "first")
        index, columns = read_labels_file(
            labels_path, evalset=evalset, source=source, class_names=names,
            num_classes=num_classes, multilabel=dataset.multilabel)
    known = read_revision_labels(store=store, labels=latest, n=dataset.n,
                                 num_labels=num_classes if dataset.multilabel else None)
    try:
        merged, added = merge_labels(known, index, columns, ids=evalset.ids)
    except InputError as error:
        raise Conflict(error.code, f"{dataset.name}: {error.message}") from error
    if not added:
        return None
    return _store_revision(session, store, dataset, merged, added,
                           1 + (latest.revision if latest else 0))


def labelled_samples(labels: np.ndarray) -> int:
    """How many samples a revision labels (a label set counts once)."""
    return int((labels.reshape(labels.shape[0], -1)[:, 0] != UNLABELLED).sum())


def _store_revision(session: Session, store: ArtifactStore, dataset: Dataset,
                    merged: np.ndarray, added: int, revision: int) -> DatasetLabels:
    """Insert the revision's row (refused if another import took its number meanwhile), then
    put its labels (an (N,) int64 .npy) into the store."""
    buffer = io.BytesIO()
    np.save(buffer, merged.astype("<i8"), allow_pickle=False)
    row = DatasetLabels(dataset_id=dataset.id, revision=revision,
                        sha256=hashlib.sha256(buffer.getvalue()).hexdigest(), added=added,
                        labelled=labelled_samples(merged))
    insert_or_conflict(session, row, code="labels_imported_meanwhile",
                       message=f"another import made revision {revision} of {dataset.name!r} "
                       "meanwhile; send the labels again")
    buffer.seek(0)
    store.put_stream(buffer)
    return row
