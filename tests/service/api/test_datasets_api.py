"""Eval sets and uploaded predictions over HTTP."""

import numpy as np
import pytest

from tests.service.api.conftest import (
    both_ways,
    error_code,
    npy_bytes,
    post_evalset,
    post_logits,
    put_evalset,
    put_logits,
)

send_evalset = both_ways(post_evalset, put_evalset)  # every eval set here, both ways


@pytest.fixture
def registered(client, npz_file, upload_model):
    """digits:1.0 (3 classes) and the eval set `eval` of 30 samples."""
    upload_model("digits", "1.0")
    assert post_evalset(client, "eval", npz_file(n=30, num_classes=3)).status_code == 201


def test_an_eval_set_is_registered_and_listed(client, npz_file, upload_evalset):
    record = upload_evalset("eval", npz_file(n=30, num_classes=3)).json()
    assert (record["name"], record["n"], record["num_classes"], record["sample_shape"]) == (
        "eval", 30, 3, [4])
    assert client.get("/evalsets").json() == [record]
    assert error_code(upload_evalset("eval", npz_file(n=10)), 409) == "dataset_exists"


def test_a_truncated_eval_set_is_422(npz_file, upload_evalset):
    path = npz_file()
    path.write_bytes(path.read_bytes()[:-40])
    assert error_code(upload_evalset("eval", path), 422) == "evalset_corrupt"


@pytest.fixture(params=[post_logits, put_logits], ids=["multipart", "raw"])
def upload_logits(request, client):
    return lambda ref, evalset, logits: request.param(client, ref, evalset, logits)


def test_uploaded_logits_are_stored(registered, upload_logits):
    record = upload_logits("digits:1.0", "eval", np.zeros((30, 3), np.float32)).json()
    assert (record["source"], record["provider"]) == ("uploaded", None)


@pytest.mark.parametrize(("logits", "code"), [
    (np.zeros((29, 3)), "logits_shape"),
    (np.array([[np.nan, 0.0, 0.0]] * 30), "non_finite"),
    (np.array([[0.0, 1.0, object()]] * 30, dtype=object), "object_array"),
])
def test_refused_logits_are_422(registered, upload_logits, logits, code):
    assert error_code(upload_logits("digits:1.0", "eval", logits), 422) == code


def test_logits_of_an_unknown_version_are_404(registered, upload_logits):
    assert error_code(upload_logits("digits:2.0", "eval", np.zeros((30, 3))),
                      404) == "version_not_found"


def test_raw_and_multipart_uploads_store_the_same_file(registered, client):
    logits = np.random.default_rng(0).normal(size=(30, 3)).astype(np.float32)
    raw = put_logits(client, "digits:1.0", "eval", logits)
    assert raw.status_code == 201, raw.text
    again = post_logits(client, "digits:1.0", "eval", logits)  # the same bytes: the same row
    assert again.status_code in (200, 201), again.text
    assert again.json()["logits_sha256"] == raw.json()["logits_sha256"]


@pytest.mark.parametrize(("url", "params"), [
    ("/models/digits/versions/1.0/predictions", {"evalset": "eval"}),
    ("/evalsets/other", {}),
    ("/models/digits/versions/2.0", {"parent": "digits:1.0"}),
], ids=["logits", "evalset", "model"])
def test_a_raw_body_of_another_type_or_too_large_is_refused(registered, client, url, params):
    before = (client.get("/models/digits").json(), client.get("/evalsets").json())
    body = npy_bytes(np.zeros((30, 3), np.float32))
    as_form = client.put(url, params=params, content=body,
                         headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert error_code(as_form, 415) == "unsupported_media_type"
    anonymous = client.put(url, params=params, content=body, headers={
        "Content-Type": "application/octet-stream", "Authorization": ""})
    assert error_code(anonymous, 401) == "missing_credentials"
    client.app.state.settings.max_upload_mb = 1
    huge = client.put(url, params=params, content=b"\0" * (2 << 20),
                      headers={"Content-Type": "application/octet-stream"})
    assert error_code(huge, 413) == "payload_too_large"
    assert not any(client.app.state.store.staging.iterdir())  # nothing left half-written
    assert (client.get("/models/digits").json(), client.get("/evalsets").json()) == before


def test_a_raw_body_whose_declared_digest_differs_is_refused(client, npz_file):
    response = client.put("/evalsets/eval", content=npz_file().read_bytes(), headers={
        "Content-Type": "application/octet-stream", "X-Flipgate-Sha256": "0" * 64})
    assert error_code(response, 422) == "digest_mismatch"
    assert client.get("/evalsets").json() == []
