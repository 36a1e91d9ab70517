"""The traffic report (flipgate.metrics.traffic): churn exact without labels, the export
order, and NFR/PFR from the labelled disagreements (exact, or an interval)."""

import hashlib

import numpy as np
import pytest
from scipy import stats

from flipgate.errors import InputError
from flipgate.metrics import count_flips
from flipgate.metrics.traffic import (
    UNLABELLED,
    LabelledPrefix,
    disagreement_order,
    hypergeometric_cdf,
    hypergeometric_interval,
    traffic_report,
)
from flipgate.traffic import merge_labels

SET_SHA = "0f" * 32


def synthetic(n=2000, classes=6, seed=0):
    """Old and new predictions that differ on about 15% of the samples, and true labels
    that the old model gets right 80% of the time."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, classes, n)
    old = np.where(rng.random(n) < 0.8, truth, rng.integers(0, classes, n))
    new = np.where(rng.random(n) < 0.15, rng.integers(0, classes, n), old)
    return old, new, truth


def labelled(truth, indices):
    labels = np.full(truth.size, UNLABELLED, np.int64)
    labels[indices] = truth[indices]
    return labels


def test_churn_and_the_export_need_no_labels():
    old, new, _ = synthetic()
    order = disagreement_order(old, new, SET_SHA)
    report = traffic_report(old, new, num_classes=6, order=order,
                            class_names=list("abcdef"), groups=np.arange(old.size) % 3)
    assert report["churn"] == np.mean(old != new)
    assert sorted(order.tolist()) == np.flatnonzero(old != new).tolist()
    assert report["nfr"] is None and report["er_old"] is None and report["labels_missing"]
    assert report["nfr_bounds"] == [0.0, report["churn"]]
    table = {(row["old_name"], row["new_name"]): row["count"] for row in report["changes"]}
    assert sum(table.values()) == report["changed"]
    assert table[("a", "b")] == np.sum((old == 0) & (new == 1))
    assert [row["changed"] for row in report["per_group_churn"]] == [
        int(np.sum((old != new)[group::3])) for group in range(3)]


def test_the_export_order_is_seeded_by_the_predictions_and_the_set():
    old, new, _ = synthetic()
    order = disagreement_order(old, new, SET_SHA)
    assert np.array_equal(order, disagreement_order(old.copy(), new.copy(), SET_SHA))
    assert not np.array_equal(order, disagreement_order(old, new, "1e" * 32))
    assert not np.array_equal(order, np.sort(order))


class SplitMix64:
    """Vigna's splitmix64.c as written there, one 64-bit output per call."""

    MASK, GAMMA = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def __init__(self, seed: int):
        self.state = seed

    def next(self) -> int:
        self.state = (self.state + self.GAMMA) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)


def test_the_export_order_is_the_one_docs_traffic_md_describes():
    """The seed from SHA-256 as described, and each disagreeing index's key the (index + 1)-th
    output of a SplitMix64 generator seeded with it; sorted by key, ties by index."""
    old, new, _ = synthetic(n=300)
    digest = hashlib.sha256(b"flipgate disagreements v1\n" + SET_SHA.encode()
                            + old.astype("<i8").tobytes() + new.astype("<i8").tobytes())
    generator = SplitMix64(int.from_bytes(digest.digest()[:8], "big"))
    key = [generator.next() for _ in range(old.size)]
    documented = sorted(np.flatnonzero(old != new).tolist(), key=lambda i: (key[i], i))
    assert disagreement_order(old, new, SET_SHA).tolist() == documented


def test_nfr_and_pfr_are_exact_once_every_disagreement_is_labelled():
    old, new, truth = synthetic()
    order = disagreement_order(old, new, SET_SHA)
    report = traffic_report(old, new, num_classes=6, order=order,
                            labels=labelled(truth, order))
    full = count_flips(old, new, truth).rates()
    assert report["disagreements"]["complete"]
    assert report["nfr"] == full["nfr"] and report["pfr"] == full["pfr"]
    assert report["er_difference"] == pytest.approx(full["er_new"] - full["er_old"], abs=1e-15)
    assert report["er_old"] is None  # the agreements are not labelled
    everything = traffic_report(old, new, num_classes=6, order=order, labels=truth)
    assert everything["er_old"] == full["er_old"] and everything["labels_missing"] is None


def test_half_the_export_gives_a_95_percent_interval_of_the_true_nfr():
    """Over 200 sets, the interval from half of the export holds the true NFR about 95% of
    the time (at least 90%), and is narrower than the sure bounds."""
    held = 0
    for seed in range(200):
        old, new, truth = synthetic(n=400, seed=seed)
        order = disagreement_order(old, new, SET_SHA)
        report = traffic_report(old, new, num_classes=6, order=order,
                                labels=labelled(truth, order[: order.size // 2]))
        low, high = report["disagreements"]["nfr_interval"]
        held += low <= count_flips(old, new, truth).rates()["nfr"] <= high
        assert report["nfr"] is None and high - low < report["churn"] / 2
        assert report["nfr_bounds"][0] <= low and high <= report["nfr_bounds"][1]
    assert held >= 180


def test_only_the_longest_labelled_prefix_is_used():
    old, new, truth = synthetic()
    order = disagreement_order(old, new, SET_SHA)
    gap = labelled(truth, np.concatenate([order[:10], order[11:40]]))
    prefix = LabelledPrefix.of(order, old, new, gap)
    assert (prefix.prefix, prefix.labelled) == (10, 39)


def test_labels_to_decide_reach_a_decision_when_the_share_holds():
    old, new, truth = synthetic(seed=5)
    order = disagreement_order(old, new, SET_SHA)
    prefix = LabelledPrefix.of(order, old, new, labelled(truth, order[:20]))
    limit = prefix.estimate("negative") * 1.1
    more = prefix.labels_to_decide(limit)
    assert 0 < more <= prefix.disagreements - prefix.prefix
    share = prefix.negative / prefix.prefix
    draws = prefix.prefix + more
    low, high = hypergeometric_interval(round(share * draws), draws, prefix.disagreements)
    assert high <= limit or low > limit


def test_hypergeometric_interval_matches_scipy_by_brute_force():
    for population, draws, x in [(40, 10, 3), (40, 40, 7), (25, 1, 0), (60, 30, 30),
                                 (5000, 2000, 150)]:
        for successes in range(0, population + 1, 1 + population // 60):
            for seen in {0, x, draws // 2, draws}:
                assert hypergeometric_cdf(seen, population, successes, draws) == \
                    pytest.approx(stats.hypergeom.cdf(seen, population, successes, draws),
                                  abs=1e-9)
        if population > 100:
            continue
        fits = [m for m in range(population + 1)
                if stats.hypergeom.sf(x - 1, population, m, draws) > 0.025
                and stats.hypergeom.cdf(x, population, m, draws) > 0.025]
        assert hypergeometric_interval(x, draws, population) == (min(fits), max(fits))


def test_labels_are_append_only():
    known = np.full(5, UNLABELLED, np.int64)
    known, added = merge_labels(known, np.array([1, 3]), np.array([2, 0]))
    assert added == 2 and known.tolist() == [-1, 2, -1, 0, -1]
    same, added = merge_labels(known, np.array([1]), np.array([2]))
    assert added == 0 and np.array_equal(same, known)
    with pytest.raises(InputError, match=r"sample 3 .*id 'r3'") as refused:
        merge_labels(known, np.array([3]), np.array([1]), ids=np.array(["r0", "r1", "r2", "r3",
                                                                       "r4"]))
    assert refused.value.code == "label_conflict"
