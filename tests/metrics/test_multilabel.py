"""The multi-label pair report (flipgate.metrics.multilabel) against the plain numpy
computation of tests/multilabel_reference.py, on random matrices, in chunks and from files."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flipgate.metrics.multilabel import compare_multilabel
from flipgate.metrics.stats import mcnemar_one_sided_p, wilson_interval
from tests.multilabel_reference import (
    assert_groups_match,
    assert_matches,
    group_reference,
    reference,
)


def random_pair(n: int, labels: int, seed: int) -> tuple[np.ndarray, ...]:
    """Labels of varying frequency and two versions' probabilities that mostly agree."""
    rng = np.random.default_rng(seed)
    y = rng.random((n, labels)) < rng.uniform(0.05, 0.6, labels)
    old = np.clip(np.where(y, 0.7, 0.3) + rng.normal(0, 0.25, (n, labels)), 0, 1)
    new = np.clip(old + rng.normal(0, 0.15, (n, labels)), 0, 1)
    return y, old, new


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), labels=st.integers(1, 7), seed=st.integers(0, 2**32 - 1),
       chunk=st.integers(1, 70))
def test_every_figure_equals_numpy_whatever_the_chunks(n, labels, seed, chunk):
    y, old, new = random_pair(n, labels, seed)
    report = compare_multilabel(y, old, new, chunk_size=chunk)
    assert_matches(report, reference(y, old > 0.5, new > 0.5, old, new))


def test_each_labels_threshold_decides_it():
    y, old, new = random_pair(300, 5, 1)
    thresholds = ([0.2, 0.4, 0.5, 0.6, 0.9], [0.7, 0.5, 0.3, 0.5, 0.1])
    report = compare_multilabel(y, old, new, thresholds=thresholds)
    expected = reference(y, old > np.array(thresholds[0]), new > np.array(thresholds[1]),
                         old, new)
    assert_matches(report, expected)
    assert expected["pooled"]["nfr"] != reference(y, old > 0.5, new > 0.5)["pooled"]["nfr"]


def test_decisions_alone_give_every_count_and_no_score():
    y, old, new = random_pair(200, 4, 2)
    report = compare_multilabel(y, (old > 0.5).astype(np.int8), new > 0.5,
                                label_names=["a", "b", "c", "d"])
    assert_matches(report, reference(y, old > 0.5, new > 0.5))
    assert report["labels_only"] and report["schurn_alpha"] is None
    assert [row["name"] for row in report["per_label"]] == ["a", "b", "c", "d"]
    assert list(report["flipped_indices"]) == ["a", "b", "c", "d"]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 80), labels=st.integers(1, 6), seed=st.integers(0, 2**32 - 1),
       chunk=st.integers(1, 90), named=st.booleans())
def test_each_groups_figures_equal_numpy_whatever_the_chunks(n, labels, seed, chunk, named):
    y, old, new = random_pair(n, labels, seed)
    codes = np.random.default_rng(seed).integers(0, 4, n)
    groups = np.array(["north", "south", "east", "west"])[codes] if named else codes * 10
    report = compare_multilabel(y, old, new, groups=groups, chunk_size=chunk)
    assert_groups_match(report, group_reference(y, old > 0.5, new > 0.5, groups))
    assert_matches(report, reference(y, old > 0.5, new > 0.5, old, new))  # groups change none


def test_a_group_that_alone_regresses_stands_out_of_the_pooled_figures():
    y, old, _ = random_pair(400, 5, 4)
    groups = np.where(np.arange(400) < 40, "night", "day")
    new = old.copy()
    new[:40, 2] = np.where(y[:40, 2], 0.1, 0.9)  # every night sample gets label 2 wrong
    report = compare_multilabel(y, old, new, groups=groups, label_names=list("abcde"))
    day, night = report["per_group"]
    assert (day["group"], day["nfr"], night["group"]) == ("day", 0.0, "night")
    right = int(np.sum((old[:40, 2] > 0.5) == y[:40, 2]))
    assert night["nfr"] == right / 40 > report["per_sample"]["nfr"] * 5
    assert night["worst_labels"] == [{"name": "c", "negative_flips": right, "nfr": right / 40}]
    assert night["er_new"] - night["er_old"] == pytest.approx(right / (40 * 5))


def test_groups_of_another_length_are_refused():
    y, old, new = random_pair(20, 3, 5)
    with pytest.raises(ValueError, match="one string or integer per sample"):
        compare_multilabel(y, old, new, groups=np.zeros(19, int))
    assert "per_group" not in compare_multilabel(y, old, new)


def test_per_label_and_per_sample_intervals_and_mcnemar():
    y, old, new = random_pair(250, 6, 3)
    report = compare_multilabel(y, old, new)
    expected = reference(y, old > 0.5, new > 0.5)
    for row, want in zip(report["per_label"], expected["per_label"], strict=True):
        assert row["nfr_ci"] == list(wilson_interval(want["negative_flips"], 250))
        assert row["pfr_ci"] == list(wilson_interval(want["positive_flips"], 250))
        assert row["churn_ci"] == list(wilson_interval(round(want["churn"] * 250), 250))
        assert row["mcnemar_p"] == mcnemar_one_sided_p(want["negative_flips"],
                                                       want["positive_flips"])
    hit = expected["per_sample"]["samples_with_negative_flips"]
    assert report["per_sample"]["nfr_ci"] == list(wilson_interval(hit, 250))


def naive_bootstrap(negative: np.ndarray, seed: int, resamples: int) -> list[float]:
    """The percentile interval of the pooled NFR, resampling the samples (rows) themselves."""
    rng = np.random.default_rng(seed)
    n = negative.shape[0]
    rates = [negative[rng.integers(0, n, n)].mean() for _ in range(resamples)]
    return [float(np.percentile(rates, 2.5)), float(np.percentile(rates, 97.5))]


def test_the_pooled_interval_is_a_seeded_bootstrap_over_samples():
    y, old, new = random_pair(400, 5, 4)
    report = compare_multilabel(y, old, new, seed=7)
    pooled = report["pooled"]
    assert compare_multilabel(y, old, new, seed=7)["pooled"] == pooled
    assert compare_multilabel(y, old, new, seed=8)["pooled"]["nfr_ci"] != pooled["nfr_ci"]
    negative = ((old > 0.5) == y) & ((new > 0.5) != y)
    assert pooled["nfr_ci"] == pytest.approx(naive_bootstrap(negative, 0, 4000), abs=0.003)
    assert pooled["nfr_ci"][0] < pooled["nfr"] < pooled["nfr_ci"][1]
    assert pooled["churn_ci"][0] < pooled["churn"] < pooled["churn_ci"][1]


def test_labels_of_one_sample_move_together_in_the_interval():
    """Labels that always flip together widen the pooled interval as samples, not pairs."""
    rng = np.random.default_rng(5)
    y = np.ones((400, 8), dtype=bool)
    hit = rng.random(400) < 0.1
    new = np.repeat(~hit[:, None], 8, axis=1)
    low, high = compare_multilabel(y, np.ones_like(y), new)["pooled"]["nfr_ci"]
    pairs_interval = wilson_interval(int(hit.sum()) * 8, 400 * 8)
    assert high - low > 1.8 * (pairs_interval[1] - pairs_interval[0])


def test_memory_mapped_files_give_the_same_report(tmp_path):
    y, old, new = random_pair(500, 9, 6)
    for name, array in (("y", y), ("old", old.astype(np.float32)), ("new", new)):
        np.save(tmp_path / f"{name}.npy", array)
    mapped = [np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("y", "old", "new")]
    assert compare_multilabel(*mapped, chunk_size=37) == compare_multilabel(
        y, old.astype(np.float32), new, chunk_size=37)


@pytest.mark.parametrize(("arrays", "thresholds", "message"), [
    ((np.zeros((3, 2), bool), np.zeros((3, 3)), np.zeros((3, 2))), (None, None), "one (N, L)"),
    ((np.zeros((3, 2), bool), np.zeros((3, 2)), np.zeros((3, 2))), ([0.5], None),
     "1 thresholds for 2 labels"),
    ((np.zeros((3, 2), bool), np.zeros((3, 2), bool), np.zeros((3, 2))), ([0.5, 0.5], None),
     "thresholds apply to probabilities"),
])
def test_shapes_that_disagree_are_refused(arrays, thresholds, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compare_multilabel(*arrays, thresholds=thresholds)
