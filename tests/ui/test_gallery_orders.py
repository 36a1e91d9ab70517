"""The pair page's gallery reads the rows of any eval set the upload took: arrays in C or
Fortran order, stored or compressed (one test per layout, on the API test app)."""

import io
import re

import numpy as np
import pytest

from service.ui.samples import npz_rows
from tests.service.api.conftest import measure, post_logits, post_model
from tests.service.conftest import write_onnx
from tests.ui.conftest import noisy_logits

SAMPLES, CLASSES = 40, 3


def evalset_bytes(arrays: dict[str, np.ndarray], compressed: bool) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "compressed"])
@pytest.mark.parametrize("shown", ["x", "images"])
def test_the_gallery_shows_rows_of_fortran_ordered_arrays(client, mint, tmp_path, compressed,
                                                          shown):
    rng = np.random.default_rng(5)
    labels = np.arange(SAMPLES) % CLASSES
    arrays = {"x": np.asfortranarray(rng.normal(size=(SAMPLES, 4)).astype(np.float32)),
              "y": labels}
    if shown == "images":
        arrays["images"] = np.asfortranarray(rng.integers(0, 256, (SAMPLES, 6, 5), np.uint8))
    response = client.post("/evalsets", data={"name": "fortran"},
                           files={"data": ("f.npz", evalset_bytes(arrays, compressed))})
    assert response.status_code == 201, response.text
    logits = {}
    for version, accuracy in (("1", 0.9), ("2", 0.5)):
        model = write_onnx(tmp_path, seed=int(version)).read_bytes()
        assert post_model(client, "f", version, model).status_code == 201
        logits[version] = noisy_logits(labels, accuracy, rng)
        assert post_logits(client, f"f:{version}", "fortran", logits[version]).is_success
    report = measure(client, "f:1", "f:2", "fortran")
    signed_in = signed_in_client(client, mint)
    page = signed_in.get("/ui/lines/f/pairs/1/2?evalset=fortran")
    assert page.status_code == 200, page.text[-500:]
    rows = [int(i) for i in re.findall(r'data-index="(\d+)"', page.text)]
    old, new = (logits[version].argmax(1) for version in ("1", "2"))
    flips = np.flatnonzero((old == labels) & (new != labels))
    assert report["negative_flips"] == flips.size > 0 and sorted(rows) == flips.tolist()
    stored = tmp_path / "f.npz"  # the rows the page drew are the arrays' own rows
    stored.write_bytes(evalset_bytes(arrays, compressed))
    assert np.array_equal(npz_rows(stored, shown, flips), arrays[shown][flips])


def signed_in_client(client, mint):
    """The client as a browser holding a session of a read-only token."""
    token = mint("read")
    client.headers.pop("Authorization")
    assert client.post("/ui/signin", data={"token": token}).status_code == 200
    return client
