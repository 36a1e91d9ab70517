"""Registering labeled data sets from real .npz files."""

import hashlib

import numpy as np
import pytest

from service.datasets.models import DatasetRole
from service.datasets.schemas import DatasetRead
from service.datasets.service import get_dataset, register_dataset
from service.errors import Conflict, InvalidInput, NotFound


def test_registration_reads_the_shape_and_stores_the_file(session, store, npz_file):
    path = npz_file(n=30, num_classes=3)
    dataset = register_dataset(session=session, store=store, name="digits-eval",
                               role=DatasetRole.EVAL, npz_path=path)
    read = DatasetRead.model_validate(get_dataset(session=session, name="digits-eval"))
    assert (read.n, read.num_classes, read.sample_shape, read.role) == (30, 3, [4], "eval")
    assert dataset.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert store.path(dataset.sha256).read_bytes() == path.read_bytes()


def test_names_are_unique(session, store, npz_file):
    register_dataset(session=session, store=store, name="d", role=DatasetRole.EVAL,
                     npz_path=npz_file())
    with pytest.raises(Conflict):
        register_dataset(session=session, store=store, name="d", role=DatasetRole.TRAIN,
                         npz_path=npz_file(seed=1))


def test_a_declared_class_count_must_cover_the_labels(session, store, npz_file):
    with pytest.raises(InvalidInput) as refused:
        register_dataset(session=session, store=store, name="d", role=DatasetRole.EVAL,
                         npz_path=npz_file(num_classes=5), num_classes=3)
    assert refused.value.code == "labels_out_of_range"


def test_files_the_library_refuses_are_invalid_input(session, store, tmp_path):
    path = tmp_path / "float-labels.npz"
    np.savez(path, x=np.zeros((3, 4), np.float32), y=np.zeros(3, np.float32))
    with pytest.raises(InvalidInput) as refused:
        register_dataset(session=session, store=store, name="d", role=DatasetRole.EVAL,
                         npz_path=path)
    assert refused.value.code == "evalset_y_dtype"


def test_unknown_names_are_not_found(session):
    with pytest.raises(NotFound):
        get_dataset(session=session, name="missing")
