"""LogitsScan: the checks and argmax of an .npy taken from its bytes as they arrive equal what
load_logits and predicted_classes find on the written file, however the bytes are cut."""

import io

import numpy as np
import pytest

from flipgate.logits_scan import LogitsScan
from flipgate.metrics import predicted_classes


def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def scanned(data: bytes, seed: int = 0):
    """Feed `data` in random pieces (some empty); the scan's result."""
    rng, scan, start = np.random.default_rng(seed), LogitsScan(), 0
    while start < len(data):
        stop = start + int(rng.integers(0, 5000))
        scan.feed(data[start:stop])
        start = stop
    return scan.result()


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<f2"])
@pytest.mark.parametrize("version", [None, (2, 0)])
def test_the_scan_finds_what_the_file_holds(dtype, version):
    logits = np.random.default_rng(1).normal(size=(997, 13)).astype(dtype)
    logits[[3, 500], [0, 7]] = [np.nan, np.inf]
    non_finite, classes = scanned(npy(logits, version))
    assert non_finite == 2
    assert classes.dtype == np.uint8
    np.testing.assert_array_equal(classes, predicted_classes(logits))


@pytest.mark.parametrize("array", [
    np.asfortranarray(np.ones((40, 3), np.float32)),  # columns first
    np.ones((40, 3), np.int32),  # not floats
    np.ones(40, np.float32),  # not (N, C)
], ids=["fortran", "integers", "one-axis"])
def test_a_file_that_is_not_plain_logits_has_no_result(array):
    assert scanned(npy(array)) is None


def test_a_body_cut_short_or_too_long_or_not_npy_has_no_result():
    data = npy(np.ones((40, 3), np.float32))
    assert scanned(data[:-5]) is None
    assert scanned(data + b"\0" * 12) is None
    assert scanned(b"PK\x03\x04" + data) is None
    assert scanned(data[:30]) is None  # the header, unfinished
