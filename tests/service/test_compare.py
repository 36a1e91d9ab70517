"""Pair metrics from compare_logits, and a line's matrix from the pair counts that the matrix
job computes from predicted classes."""

import numpy as np
import pytest
from sqlalchemy import func, select

from flipgate.formats.evalsets import load_evalset
from flipgate.metrics import compare_logits, count_flips, matrices_from_predictions
from service.compare.matrix import line_matrix, matrix_inputs, store_pair_counts
from service.compare.models import PairCounts, PairMetrics
from service.compare.service import store_pair_metrics
from service.datasets.models import DatasetRole
from service.datasets.service import register_dataset
from service.errors import InvalidInput
from service.predictions.models import PredictionSource
from service.predictions.service import (
    get_predictions,
    give_classes,
    read_predicted_classes,
)
from service.registry.service import register_version
from tests.service.conftest import linear_weights, store_logits

SEEDS = (0, 1, 2)


@pytest.fixture
def history(session, store, onnx_file, npz_file):
    """Three versions of a line, an eval set, and each version's logits on it."""
    path = npz_file(n=200, num_classes=3)
    dataset = register_dataset(session=session, store=store, name="eval", role=DatasetRole.EVAL,
                               npz_path=path)
    evalset = load_evalset(path)
    versions, logits = [], []
    for seed in SEEDS:
        versions.append(register_version(session=session, store=store, line_name="digits",
                                         version=f"1.{seed}", onnx_path=onnx_file(3, seed)))
        weight, bias = linear_weights(3, seed)
        logits.append(evalset.x @ weight + bias)
    return versions, dataset, logits, evalset.y


def store_pair(session, history, old: int, new: int) -> PairMetrics:
    versions, dataset, logits, labels = history
    return store_pair_metrics(session=session, old=versions[old], new=versions[new],
                              dataset=dataset, report=compare_logits(logits[old], logits[new],
                                                                     labels))


def test_storing_a_triple_twice_keeps_one_row(session, history):
    first = store_pair(session, history, 0, 1)
    assert store_pair(session, history, 0, 1) is first
    assert session.scalar(select(func.count()).select_from(PairMetrics)) == 1
    report = first.report
    assert (first.nfr, first.nfr_ci_low, first.n) == (report["nfr"], report["nfr_ci"][0], 200)
    assert len(report["per_class"]) == 3


@pytest.fixture
def scored(session, store, history):
    """The history with each version's logits stored; the logits' predicted classes."""
    versions, dataset, logits, _ = history
    for version, array in zip(versions, logits, strict=True):
        store_logits(session, store, version, dataset, array, source=PredictionSource.UPLOADED)
    return [array.argmax(axis=1) for array in logits]


def count_missing(session, store, dataset) -> list[PairCounts]:
    """What the matrix job of `digits` on `dataset` counts, read as the job reads it."""
    inputs = matrix_inputs(session=session, params={"line": "digits", "evalset": dataset.name})
    return inputs.count(store, inputs.classes(store))


def test_pair_counts_equal_a_loop_over_pairs_and_the_library(session, store, history, scored):
    versions, dataset, _, labels = history
    rows = count_missing(session, store, dataset)
    assert [(row.first_version_id, row.second_version_id) for row in rows] == [
        (versions[i].id, versions[j].id) for i, j in ((0, 1), (0, 2), (1, 2))]
    classes = {version.id: predicted for version, predicted in zip(versions, scored, strict=True)}
    for row in rows:
        first, second = classes[row.first_version_id], classes[row.second_version_id]
        flips = count_flips(first, second, labels)
        assert (row.n, row.only_first_right, row.only_second_right, row.differ) == (
            200, flips.negative_flips, flips.positive_flips, int((first != second).sum()))
    store_pair_counts(session=session, rows=rows)
    matrix = line_matrix(session=session, line_name="digits", dataset=dataset)
    expected = matrices_from_predictions(scored, labels)
    assert matrix.missing == []
    assert {name: getattr(matrix, name) for name in expected} == {
        name: values.tolist() for name, values in expected.items()}


def test_counts_stored_twice_are_kept_once(session, store, history, scored):
    dataset = history[1]
    first, second = (count_missing(session, store, dataset) for _ in range(2))  # a race
    assert len(store_pair_counts(session=session, rows=first)) == 3
    assert store_pair_counts(session=session, rows=second) == []
    assert session.scalar(select(func.count()).select_from(PairCounts)) == 3
    assert count_missing(session, store, dataset) == []


def test_pairs_not_counted_are_none_and_listed(session, store, history, scored):
    versions, dataset, _, _ = history
    rows = count_missing(session, store, dataset)
    store_pair_counts(session=session, rows=[row for row in rows if (
        row.first_version_id, row.second_version_id) == (versions[0].id, versions[2].id)])
    matrix = line_matrix(session=session, line_name="digits", dataset=dataset)
    assert matrix.nfr[0][2] is not None and matrix.nfr[2][0] == matrix.pfr[0][2]
    assert matrix.nfr[0][1] is None and [matrix.churn[i][i] for i in range(3)] == [0.0] * 3
    assert sorted((pair.old, pair.new) for pair in matrix.missing) == [
        ("1.0", "1.1"), ("1.1", "1.0"), ("1.1", "1.2"), ("1.2", "1.1")]
    assert {pair.job_id for pair in matrix.missing} == {None}


def test_predictions_kept_without_classes_get_them(session, store, history, scored):
    versions, dataset, _, _ = history
    row = get_predictions(session=session, version=versions[1], dataset=dataset)
    row.classes_sha256 = None
    inputs = matrix_inputs(session=session, params={"line": "digits", "evalset": "eval"})
    classes = inputs.classes(store)
    give_classes(session=session, predictions=inputs.predictions, classes=classes)
    assert row.classes_sha256 == classes[1]
    np.testing.assert_array_equal(read_predicted_classes(store=store, prediction=row), scored[1])


def test_a_version_is_not_compared_with_itself(session, history):
    with pytest.raises(InvalidInput):
        store_pair(session, history, 1, 1)
