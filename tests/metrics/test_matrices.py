"""Pairwise NFR/PFR/churn matrices against a plain loop over pairs."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flipgate.metrics import (
    class_dtype,
    count_flips,
    matrices_from_predictions,
    pair_count_matrices,
    pairwise_matrices,
    predicted_classes,
)
from flipgate.metrics import matrices as matrices_module

from .test_flips import LABELS, NEW, OLD


def loop_over_pairs(predictions: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """The reference: one count_flips call per ordered pair."""
    versions = len(predictions)
    out = {key: np.zeros((versions, versions)) for key in ("nfr", "pfr", "churn")}
    for i in range(versions):
        for j in range(versions):
            rates = count_flips(predictions[i], predictions[j], labels).rates()
            for key in out:
                out[key][i, j] = rates[key]
    return out


def test_hand_case_with_a_perfect_version():
    result = pairwise_matrices(np.stack([OLD, NEW, LABELS]), LABELS)
    assert result["nfr"][0, 1] == pytest.approx(0.2)
    assert result["nfr"][0, 2] == 0  # a perfect new version breaks nothing
    assert result["nfr"][2, 0] == pytest.approx(0.4)  # every old error is a regression from it
    assert result["churn"][0, 1] == pytest.approx(0.5)
    assert result["churn"][1, 2] == pytest.approx(0.4)


@st.composite
def version_predictions(draw):
    versions, n = draw(st.integers(1, 5)), draw(st.integers(1, 40))
    classes = draw(st.integers(2, 4))
    cells = st.lists(st.integers(0, classes - 1), min_size=versions * n, max_size=versions * n)
    labels = st.lists(st.integers(0, classes - 1), min_size=n, max_size=n)
    return np.array(draw(cells)).reshape(versions, n), np.array(draw(labels))


@given(version_predictions())
def test_matches_loop_and_has_the_required_structure(case):
    predictions, labels = case
    fast, slow = pairwise_matrices(predictions, labels), loop_over_pairs(predictions, labels)
    for key in ("nfr", "pfr", "churn"):
        np.testing.assert_allclose(fast[key], slow[key], rtol=0, atol=1e-12)
        assert np.all(np.diag(fast[key]) == 0)
    assert np.array_equal(fast["nfr"], fast["pfr"].T)
    assert np.array_equal(fast["churn"], fast["churn"].T)


@given(version_predictions())
def test_pair_counts_are_the_flip_counts_of_every_ordered_pair(case):
    predictions, labels = case
    counts = pair_count_matrices(list(predictions), labels)
    for i, old in enumerate(predictions):
        for j, new in enumerate(predictions):
            flips = count_flips(old, new, labels)
            changed = flips.negative_flips + flips.positive_flips + flips.both_wrong_changed
            assert (counts.only_right[i, j], counts.only_right[j, i], counts.differ[i, j]) == (
                flips.negative_flips, flips.positive_flips, changed)
    assert counts.n == labels.size and counts.only_right.dtype == np.int64


def test_chunked_accumulation_gives_the_same_counts(monkeypatch):
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 5, 3000)
    predictions = np.where(rng.random((6, 3000)) < 0.7, labels, rng.integers(0, 5, (6, 3000)))
    whole = pairwise_matrices(predictions, labels)
    monkeypatch.setattr(matrices_module, "CHUNK_SAMPLES", 64)
    chunked = pairwise_matrices(predictions, labels)
    for key in whole:
        np.testing.assert_allclose(chunked[key], whole[key], rtol=0, atol=1e-12)
    np.testing.assert_allclose(whole["churn"], loop_over_pairs(predictions, labels)["churn"])


@pytest.mark.parametrize(
    ("predictions", "labels", "message"),
    [
        (np.zeros(4, int), np.zeros(4, int), "must be a \\(V, N\\) integer array"),
        (np.zeros((2, 4)), np.zeros(4, int), "must be a \\(V, N\\) integer array"),
        (np.zeros((2, 4), int), np.zeros(3, int), "labels must be an integer array of shape"),
        (np.zeros((2, 0), int), np.zeros(0, int), "at least one sample"),
    ],
)
def test_bad_shapes_are_refused(predictions, labels, message):
    with pytest.raises(ValueError, match=message):
        pairwise_matrices(predictions, labels)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int64])
def test_compact_predictions_give_the_loop_result_exactly(dtype, monkeypatch):
    monkeypatch.setattr(matrices_module, "CHUNK_SAMPLES", 100)  # several blocks and a short one
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 200, 1050)
    predictions = [np.where(rng.random(1050) < 0.8, labels, rng.integers(0, 200, 1050))
                   .astype(dtype) for _ in range(5)]
    fast = matrices_from_predictions(predictions, labels.astype(dtype))
    slow = loop_over_pairs(np.stack(predictions).astype(np.int64), labels)
    for key in ("nfr", "pfr", "churn"):
        assert np.array_equal(fast[key], slow[key]), key


def test_predicted_classes_of_a_memory_mapped_file(tmp_path):
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((1234, 300), dtype=np.float32)
    np.save(tmp_path / "logits.npy", logits)
    mapped = np.load(tmp_path / "logits.npy", mmap_mode="r")
    predictions = predicted_classes(mapped, chunk_size=100)
    assert predictions.dtype == np.uint16 and predictions.tolist() == logits.argmax(1).tolist()
    assert predicted_classes(logits[:, :256]).dtype == np.uint8
    assert class_dtype(256) == np.uint8 and class_dtype(257) == np.uint16
    assert class_dtype(70_000) == np.uint32


def test_compact_predictions_are_validated():
    labels = np.array([0, 1, 2])
    with pytest.raises(ValueError, match="one integer array of shape \\(3,\\) per version"):
        matrices_from_predictions([np.array([0, 1])], labels)
    with pytest.raises(ValueError, match="one integer array"):
        matrices_from_predictions([], labels)
    with pytest.raises(ValueError, match="classes must be non-negative"):
        matrices_from_predictions([np.array([0, -1, 2])], labels)
