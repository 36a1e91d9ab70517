"""Pair metrics from compare_logits, and a line's matrices read back from them."""

import numpy as np
import pytest
from sqlalchemy import func, select

from flipgate.formats import load_evalset
from flipgate.metrics import compare_logits, pairwise_matrices
from service.compare.models import PairMetrics
from service.compare.service import store_pair_metrics, versions_matrix
from service.datasets.models import DatasetRole
from service.datasets.service import register_dataset
from service.errors import InvalidInput
from service.registry.service import list_versions, register_version
from tests.service.conftest import linear_weights

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


def line_matrix(session, dataset):
    """The stored-rows matrix over every version of the line `digits`."""
    return versions_matrix(session=session, dataset=dataset,
                           versions=list_versions(session=session, line_name="digits"))


def test_matrix_equals_pairwise_matrices_of_the_library(session, history):
    for old in range(len(SEEDS)):
        for new in range(len(SEEDS)):
            if old != new:
                store_pair(session, history, old, new)
    _, dataset, logits, labels = history
    matrix = line_matrix(session, dataset)
    expected = pairwise_matrices(np.stack([z.argmax(axis=1) for z in logits]), labels)
    assert matrix.versions == ["1.0", "1.1", "1.2"]
    for name in ("nfr", "pfr", "churn"):
        np.testing.assert_allclose(np.array(getattr(matrix, name)), expected[name])


def test_pairs_not_computed_are_none(session, history):
    store_pair(session, history, 0, 2)
    matrix = line_matrix(session, history[1])
    assert matrix.nfr[0][2] is not None and matrix.nfr[2][0] is None
    assert [matrix.churn[i][i] for i in range(3)] == [0.0, 0.0, 0.0]


def test_a_version_is_not_compared_with_itself(session, history):
    with pytest.raises(InvalidInput):
        store_pair(session, history, 1, 1)
