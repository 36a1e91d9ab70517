"""Registering and finding labeled data sets."""

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from flipgate.formats.evalsets import check_labels, label_columns, load_evalset
from flipgate.metrics.traffic import UNLABELLED
from service.datasets.models import Dataset, DatasetRole
from service.db import insert_or_conflict, one_or_not_found
from service.errors import InvalidInput, library_input
from service.names import check_name
from service.storage import ArtifactStore, file_sha256


def register_dataset(
    *, session: Session, store: ArtifactStore, name: str, role: DatasetRole, npz_path: Path,
    num_classes: int | None = None, source: str | None = None,
    max_decompressed_bytes: int | None = None, sha256: str | None = None,
    multilabel: bool = False,
) -> Dataset:
    """Store an .npz (whose digest is `sha256`, when taken already) under a new name;
    classes default to the number of names in its `classes`, else to the largest label + 1
    (string labels without `classes`: the number of distinct names, mapped to columns by
    each line's class names when the line is measured on it; a training set needs `classes`).
    An eval set without `y` is a traffic set (its class count None without `classes`); a
    training set needs labels. A set (eval or training) whose y is a 0/1 matrix (N, L), or
    label-name sets mapped by its `classes`, is multi-label: its class count is L. A traffic
    set is multi-label when `multilabel` says so (its label count that of its `classes`, else
    None: the line's applies); a labeled set's kind is its y's (`multilabel` on a
    single-label y, or on a training set, is refused, `evalset_kind_mismatch`).
    The file is validated (memory-mapped where it can be) and the row inserted before the
    file enters the store, so a refused upload leaves nothing behind."""
    check_name(name, "dataset_name")
    with library_input():
        data = load_evalset(npz_path, mmap=True, source=source,
                            max_decompressed_bytes=max_decompressed_bytes,
                            multilabel=True)
        if multilabel and (role != DatasetRole.EVAL or (data.labeled and not data.multilabel)):
            raise InvalidInput("evalset_kind_mismatch", f"{name}: multilabel applies to eval "
                               "sets whose y is a label matrix (N, L) and to traffic sets; "
                               "this set has one label per sample")
        if data.multilabel:
            num_classes = data.y.shape[1]
        elif data.labels_named and role == DatasetRole.TRAIN:
            raise InvalidInput("labels_need_classes", f"{name}: y holds class names; add an "
                               "array `classes` (one name per output column) to the "
                               "training set")
        num_classes = num_classes or (len(data.classes) if data.classes else None)
        if data.labeled and not data.multilabel:
            if not data.labels_named:
                check_labels(data.y, num_classes, source=name)
            num_classes = num_classes or known_classes(data.y)
        elif not data.labeled and role != DatasetRole.EVAL:
            raise InvalidInput("training_set_needs_labels", f"{name}: a training set needs "
                               "labels (an array `y`)")
    row = Dataset(name=name, role=role, sha256=sha256 or file_sha256(npz_path), n=data.n,
                  num_classes=num_classes, sample_shape=list(data.sample_shape),
                  labeled=data.labeled, multilabel=data.multilabel or multilabel,
                  label_names=list(data.classes) if (data.multilabel or multilabel)
                  and data.classes else None)
    insert_or_conflict(session, row, code="dataset_exists",
                       message=f"data set {name!r} already exists")
    store.put_file(npz_path, row.sha256)
    return row


def get_dataset(*, session: Session, name: str) -> Dataset:
    """The data set called `name`."""
    return one_or_not_found(session, select(Dataset).where(Dataset.name == name),
                            code="dataset_not_found", message=f"no data set {name!r}")


ROLE_MISMATCH_CODES = {DatasetRole.EVAL: "not_an_evalset", DatasetRole.TRAIN: "not_a_training_set"}


def get_dataset_of_role(*, session: Session, name: str, role: DatasetRole) -> Dataset:
    """The data set called `name`, which must be a `role` set (422 otherwise)."""
    dataset = get_dataset(session=session, name=name)
    if dataset.role != role:
        raise InvalidInput(ROLE_MISMATCH_CODES[role], f"data set {name!r} is a {dataset.role} "
                           f"set, not a {role} set")
    return dataset


def list_datasets(*, session: Session, role: DatasetRole) -> list[Dataset]:
    """The data sets of one role, by name."""
    statement = select(Dataset).where(Dataset.role == role).order_by(Dataset.name)
    return list(session.scalars(statement))


def read_groups(*, store: ArtifactStore, dataset: Dataset) -> np.ndarray | None:
    """The optional `groups` array of a stored eval set (one string or integer per sample)."""
    with np.load(store.local_path(dataset.sha256), allow_pickle=False) as archive:
        return archive["groups"] if "groups" in archive.files else None


def known_classes(labels: np.ndarray) -> int:
    """How many classes labels show at least: the largest index + 1, or the distinct names."""
    return int(np.unique(labels).size) if labels.dtype.kind == "U" else int(labels.max()) + 1


def read_labels(*, store: ArtifactStore, dataset: Dataset,
                class_names: Sequence[str] | None = None) -> np.ndarray:
    """The labels y of a stored data set as column indices: class names mapped by the set's
    own `classes`, else by `class_names` (the measured line's, from its models' class
    labels); 422 `unknown_class_name` naming a name no column has (the inputs are not read).
    Everything that reads a stored set's labels for a line goes through here. On a traffic
    set, UNLABELLED (-1) for every sample (its labels are revisions:
    service.datasets.labels)."""
    if not dataset.labeled:
        return np.full(dataset.n, UNLABELLED, dtype=np.int64)
    with np.load(store.local_path(dataset.sha256), allow_pickle=False) as archive:
        labels = archive["y"]
        if "classes" in archive.files:
            class_names = archive["classes"].tolist()
    with library_input():
        return label_columns(labels, class_names, source=f"eval set {dataset.name!r}")


def read_label_matrix(*, store: ArtifactStore, dataset: Dataset) -> np.ndarray:
    """The labels of a stored multi-label set: a bool matrix (N, L) (label-name sets mapped
    by its `classes`)."""
    with library_input():
        return load_evalset(store.local_path(dataset.sha256), mmap=True, multilabel=True).y

