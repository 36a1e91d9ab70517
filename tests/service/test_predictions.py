"""Storing the logits of a version on a data set."""

import numpy as np
import pytest
from sqlalchemy import func, select

from service.datasets.models import DatasetRole
from service.datasets.service import register_dataset
from service.errors import Conflict, InvalidInput
from service.predictions.models import Prediction, PredictionSource
from service.predictions.service import (
    check_logits_file,
    get_predictions,
    predicted_classes_artifact,
    read_logits,
    read_predicted_classes,
    store_logits_file,
)
from service.registry.service import register_version
from tests.service.conftest import store_logits


@pytest.fixture
def version_and_dataset(session, store, onnx_file, npz_file):
    version = register_version(session=session, store=store, line_name="digits",
                               version="1.0", onnx_path=onnx_file(num_classes=3))
    dataset = register_dataset(session=session, store=store, name="eval",
                               role=DatasetRole.EVAL, npz_path=npz_file(n=30, num_classes=3))
    return version, dataset


@pytest.fixture
def save(session, store, version_and_dataset):
    """Stores logits for the registered version on the registered data set."""
    version, dataset = version_and_dataset

    def save_logits(logits: np.ndarray):
        return store_logits(session, store, version, dataset, logits,
                            provider="CPUExecutionProvider")

    return save_logits


def logits(seed: int = 0, shape: tuple[int, int] = (30, 3)) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_logits_round_trip_through_the_store(session, store, save, version_and_dataset):
    stored = save(logits())
    found = get_predictions(session=session, version=version_and_dataset[0],
                            dataset=version_and_dataset[1])
    assert found is stored and found.provider == "CPUExecutionProvider"
    np.testing.assert_array_equal(read_logits(store=store, prediction=found), logits())


def test_one_prediction_per_version_and_data_set(session, save):
    first = save(logits())
    assert save(logits()) is first
    with pytest.raises(Conflict):
        save(logits(seed=1))
    assert session.scalar(select(func.count()).select_from(Prediction)) == 1


@pytest.mark.parametrize(("bad", "code"), [
    (logits(shape=(29, 3)), "logits_shape"),
    (logits(shape=(30, 4)), "logits_shape"),
    (np.full((30, 3), np.nan, np.float32), "non_finite"),
    (np.zeros((30, 3), np.int64), "logits_dtype"),
])
def test_logits_that_do_not_fit_are_refused(save, bad, code):
    with pytest.raises(InvalidInput) as refused:
        save(bad)
    assert refused.value.code == code


def test_predicted_classes_are_stored_once_in_the_smallest_dtype(store, save):
    row = save(logits())
    classes = read_predicted_classes(store=store, prediction=row)
    assert classes.dtype == np.uint8
    np.testing.assert_array_equal(classes, logits().argmax(axis=1))
    assert save(logits()).classes_sha256 == row.classes_sha256
    assert store.exists(row.classes_sha256)


def test_a_logits_file_is_linked_into_the_store_with_its_classes(session, store, tmp_path,
                                                                 version_and_dataset):
    version, dataset = version_and_dataset
    path = tmp_path / "logits.npy"
    np.save(path, logits(seed=3))
    checked = check_logits_file(version=version, dataset=dataset, npy_path=path)
    row = store_logits_file(session=session, store=store, version=version, dataset=dataset,
                            logits=checked, source=PredictionSource.UPLOADED)
    assert store.path(row.logits_sha256).stat().st_ino == path.stat().st_ino  # no copy
    np.testing.assert_array_equal(read_predicted_classes(store=store, prediction=row),
                                  logits(seed=3).argmax(axis=1))


def test_a_row_stored_without_classes_gets_them_from_its_logits(session, store, save):
    row = save(logits(seed=2))
    row.classes_sha256 = None  # a row stored before migration 0006
    expected = logits(seed=2).argmax(axis=1)
    np.testing.assert_array_equal(read_predicted_classes(store=store, prediction=row), expected)
    row.classes_sha256 = predicted_classes_artifact(store=store, prediction=row)
    np.testing.assert_array_equal(read_predicted_classes(store=store, prediction=row), expected)
