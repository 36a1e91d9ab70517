"""The streamed pair report against the plain per-sample definitions, on arrays and files."""

import json
import subprocess
import sys

import numpy as np
import pytest

from flipgate.metrics import (
    compare_logits,
    confidence_gap,
    count_flips,
    describe,
    expected_calibration_error,
    flipped_indices,
    logit_displacement,
    per_class,
    prediction_difference,
    schurn,
    softmax,
    wilson_interval,
)

from .test_flips import LABELS, NEW, OLD


def logits_pair(n: int, classes: int, dtype, seed: int) -> tuple[np.ndarray, ...]:
    """Old logits that are right on about 2/3 of the samples and new ones that move a little."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    old = rng.standard_normal((n, classes)) * 2
    old[np.arange(n)[::3], labels[::3]] += 4
    new = old + rng.standard_normal((n, classes))
    return old.astype(dtype), new.astype(dtype), labels


CASES = [(40, 2, np.float64, 0), (300, 7, np.float32, 1), (500, 50, np.float32, 2),
         (64, 1000, np.float32, 3)]


@pytest.mark.parametrize(("n", "classes", "dtype", "seed"), CASES)
@pytest.mark.parametrize("chunk_size", [1, 7, None])
def test_streamed_report_equals_the_plain_definitions(n, classes, dtype, seed, chunk_size):
    old, new, labels = logits_pair(n, classes, dtype, seed)
    report = compare_logits(old, new, labels, chunk_size=chunk_size)
    old_pred, new_pred = old.argmax(1), new.argmax(1)
    counts = count_flips(old_pred, new_pred, labels)
    flipped = flipped_indices(old_pred, new_pred, labels)
    # Exact: every count, rate derived from counts, table and index list.
    assert {key: report[key] for key in counts.rates()} == counts.rates()
    assert report["per_class"] == per_class(old_pred, new_pred, labels, classes)
    assert report["flipped_indices"] == {kind: idx.tolist() for kind, idx in flipped.items()}
    assert (report["negative_flips"], report["both_wrong"]) == (counts.negative_flips,
                                                                counts.both_wrong)
    # Accumulated over chunks: equal to float32 rounding.
    old_probs, new_probs = softmax(old), softmax(new)
    close = {"rel": 2e-6, "abs": 1e-7}
    assert report["schurn"] == pytest.approx(schurn(old, new), **close)
    assert report["prediction_difference"] == pytest.approx(
        prediction_difference(np.stack([old_probs, new_probs]), labels), **close)
    gaps = confidence_gap(old_probs), confidence_gap(new_probs)
    confidence = report["confidence"]
    assert confidence["old_mean_gap"] == pytest.approx(float(gaps[0].mean()), **close)
    assert confidence["new_ece"] == pytest.approx(
        expected_calibration_error(new_probs, labels), **close)
    assert confidence["negative_flips_old_gap"] == pytest.approx(
        describe(gaps[0][flipped["negative"]]), **close)
    displacement = logit_displacement(old, new)
    assert report["displacement"]["all"] == pytest.approx(describe(displacement), **close)
    assert report["displacement"]["kept"] == pytest.approx(
        describe(displacement[old_pred == new_pred]), **close)


@pytest.mark.filterwarnings("error")  # no overflow on the way, not even a warning
def test_finite_logits_near_the_float32_limit_give_a_finite_report():
    old, new, labels = logits_pair(200, 5, np.float64, 4)
    scale = np.finfo(np.float32).max / np.abs(np.concatenate([old, new])).max()
    old, new = (old * scale).astype(np.float32), (new * scale).astype(np.float32)
    assert np.isfinite(old).all() and np.isfinite(new).all()
    report = compare_logits(old, new, labels)
    json.dumps(report, allow_nan=False)  # every number finite: it stores and prints
    displacement = logit_displacement(old.astype(np.float64), new.astype(np.float64))
    assert report["displacement"]["all"] == pytest.approx(describe(displacement), rel=1e-6)
    gaps = confidence_gap(softmax(old.astype(np.float64)))
    assert report["confidence"]["old_mean_gap"] == pytest.approx(float(gaps.mean()), rel=1e-6)


def test_schurn_alpha_other_than_one_is_streamed_too():
    old, new, labels = logits_pair(90, 5, np.float32, 4)
    report = compare_logits(old, new, labels, schurn_alpha=2.5, chunk_size=8)
    assert report["schurn"] == pytest.approx(schurn(old, new, alpha=2.5), rel=2e-6)
    assert report["schurn_alpha"] == 2.5
    with pytest.raises(ValueError, match="alpha must be positive"):
        compare_logits(old, new, labels, schurn_alpha=0)
    with pytest.raises(ValueError, match="chunk size must be >= 1"):
        compare_logits(old, new, labels, chunk_size=0)


def test_memory_mapped_files_give_the_report_of_the_arrays(tmp_path):
    old, new, labels = logits_pair(2000, 30, np.float32, 5)
    np.save(tmp_path / "old.npy", old)
    np.save(tmp_path / "new.npy", new)
    mapped = [np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("old", "new")]
    seen = []
    report = compare_logits(*mapped, labels, chunk_size=300,
                            progress=lambda done, total: seen.append((done, total)))
    assert report == compare_logits(old, new, labels, chunk_size=300)
    assert seen == [(stop, 2000) for stop in (300, 600, 900, 1200, 1500, 1800, 2000)]


def test_nfr_mc_counts_new_errors_that_differ_from_the_old_prediction():
    eye = np.eye(3)
    report = compare_logits(eye[OLD] * 4, eye[NEW] * 4, LABELS)
    # New errors at 2, 3, 6, 9: 2 and 3 are negative flips, 6 changed one wrong label for
    # another (old 1, new 2), 9 kept its wrong label (old 2, new 2).
    assert report["both_wrong_changed"] == 1
    assert report["nfr_mc"] == pytest.approx(3 / 10)
    assert report["nfr_mc"] == (report["negative_flips"] + report["both_wrong_changed"]) / 10
    wrong_and_changed = (NEW != LABELS) & (NEW != OLD)
    assert report["nfr_mc"] == np.mean(wrong_and_changed)


@pytest.mark.parametrize("seed", range(5))
def test_nfr_mc_identity_on_random_pairs(seed):
    old, new, labels = logits_pair(400, 4, np.float32, seed)
    report = compare_logits(old, new, labels, chunk_size=37)
    old_pred, new_pred = old.argmax(1), new.argmax(1)
    assert report["nfr_mc"] * 400 == pytest.approx(
        report["negative_flips"] + report["both_wrong_changed"], abs=1e-9)
    assert report["nfr_mc"] == pytest.approx(np.mean((new_pred != labels) & (new_pred != old_pred)))
    assert report["nfr_mc"] <= report["er_new"]


def test_per_group_table_by_hand():
    eye = np.eye(3)
    groups = np.array(["b", "a", "a", "b", "a", "c", "c", "b", "a", "b"])
    report = compare_logits(eye[OLD] * 4, eye[NEW] * 4, LABELS, groups=groups, chunk_size=3)
    rows = {row["group"]: row for row in report["per_group"]}
    assert list(rows) == ["a", "b", "c"]
    # a = samples 1, 2, 4, 8: negative flip at 2, positive flip at 4; old wrong at 4, new at 2.
    assert rows["a"] == {
        "group": "a", "n": 4, "er_old": 0.25, "er_new": 0.25, "nfr": 0.25, "pfr": 0.25,
        "negative_flips": 1, "positive_flips": 1, "nfr_ci": list(wilson_interval(1, 4)),
        "pfr_ci": list(wilson_interval(1, 4))}
    # b = samples 0, 3, 7, 9: negative flip at 3; 9 wrong for both.
    assert (rows["b"]["negative_flips"], rows["b"]["er_old"], rows["b"]["er_new"]) == (1, 0.25,
                                                                                        0.5)
    # c = samples 5, 6: positive flip at 5; 6 wrong for both.
    assert (rows["c"]["n"], rows["c"]["pfr"], rows["c"]["nfr"]) == (2, 0.5, 0.0)
    assert rows["c"]["pfr_ci"][0] < 0.5 < rows["c"]["pfr_ci"][1]
    assert sum(row["negative_flips"] for row in rows.values()) == report["negative_flips"]
    json.dumps(report, allow_nan=False)


def test_integer_groups_and_no_groups():
    old, new, labels = logits_pair(200, 5, np.float32, 6)
    plain = compare_logits(old, new, labels)
    assert "per_group" not in plain
    grouped = compare_logits(old, new, labels, groups=np.arange(200) % 3)
    assert [row["group"] for row in grouped["per_group"]] == [0, 1, 2]
    assert {key: value for key, value in grouped.items() if key != "per_group"} == plain
    with pytest.raises(ValueError, match="one string or integer per sample"):
        compare_logits(old, new, labels, groups=np.zeros(199, int))
    with pytest.raises(ValueError, match="one string or integer per sample"):
        compare_logits(old, new, labels, groups=np.zeros(200))


PEAK_SCRIPT = """
import sys, numpy as np
from pathlib import Path
from flipgate.metrics import compare_logits
folder, n = Path(sys.argv[1]), int(sys.argv[2])
old, new = (np.load(folder / f"{name}.npy", mmap_mode="r")[:n] for name in ("old", "new"))
compare_logits(old, new, np.load(folder / "labels.npy")[:n], chunk_size=200)
status = Path("/proc/self/status").read_text().splitlines()
print(next(line.split()[1] for line in status if line.startswith("VmHWM")))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_peak_memory_does_not_grow_with_the_number_of_samples(tmp_path):
    n, classes = 60_000, 500  # two files of 120 MB each
    rng = np.random.default_rng(0)
    np.save(tmp_path / "labels.npy", rng.integers(0, classes, n))
    for name in ("old", "new"):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal((n, classes), dtype=np.float32))

    def peak_kib(samples: int) -> int:
        done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path), str(samples)],
                              capture_output=True, text=True, check=True)
        return int(done.stdout)

    small, large = peak_kib(6_000), peak_kib(n)
    # 54,000 more samples are 216 MB more logits; the report may keep ~5 bytes a sample more.
    assert large - small < 20 * 1024, (small, large)
