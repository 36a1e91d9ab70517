"""The API on an S3 store (a real SeaweedFS): a raw PUT of logits streams into the bucket
and is checked as the local store checks it; a store that cannot be reached is 503 with
nothing kept; /readyz names its error type only."""

import hashlib
import time

import numpy as np
import pytest
from sqlalchemy import select

from flipgate.upload_client import DIGEST_HEADER, DIGEST_WANTED_HEADER
from service.predictions.models import Prediction
from service.storage import open_store
from service.storage.s3 import ATTEMPTS
from tests.e2e.conftest import wait_for
from tests.s3server import s3_server
from tests.service.api.conftest import (
    error_code,
    npy_bytes,
    post_evalset,
    post_model,
    put_logits,
    put_raw,
    rolled_back_client,
    store_settings,
)

URL = "/models/digits/versions/1.0/predictions"
# what is tested here is the store's: one database is enough (the rows' rollback on a
# refusal is the same on both, tests/service/api/test_datasets_api.py)
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def settings(engine, tmp_path, s3_settings):
    """The API's settings with its artifact store in the S3 server."""
    return store_settings(engine, tmp_path).model_copy(
        update={"artifact_store": s3_settings.artifact_store})


@pytest.fixture
def registered(client, npz_file, upload_model):
    """digits:1.0 (3 classes) and the eval set `eval` of 30 samples."""
    upload_model("digits", "1.0")
    assert post_evalset(client, "eval", npz_file(n=30, num_classes=3)).status_code == 201


def test_healthz_tells_upload_clients_that_a_declared_digest_saves_a_copy(client):
    assert client.get("/healthz").headers.get(DIGEST_WANTED_HEADER) == "1"


def test_readyz_names_the_store_by_its_kind(client):
    """As docs/server.md says, and as the local folder answers `local`."""
    assert client.get("/readyz").json()["checks"]["artifacts"] == {"status": "ok",
                                                                   "detail": "s3"}


def test_a_raw_put_of_logits_streams_into_the_bucket_once(client, registered, s3, s3_prefix,
                                                          settings):
    logits = np.random.default_rng(0).normal(size=(30, 3)).astype(np.float32)
    stored = put_logits(client, "digits:1.0", "eval", logits)
    assert stored.status_code == 201, stored.text
    keys = s3.keys(s3_prefix)
    store = client.app.state.store
    assert store.key(stored.json()["logits_sha256"]) in keys
    assert not any("/staging/" in key for key in keys)
    assert s3.incomplete_uploads(s3_prefix) == []
    again = put_logits(client, "digits:1.0", "eval", logits)  # the same bytes: nothing new
    assert again.status_code in (200, 201) and s3.keys(s3_prefix) == keys
    assert not (settings.data_dir / "artifacts").exists()  # nothing on the API's disk
    path = store.local_path(stored.json()["logits_sha256"])  # read back through the cache
    assert np.array_equal(np.load(path, mmap_mode="r"), logits)


def test_logits_whose_digest_is_declared_stream_to_their_address(client, registered, s3,
                                                                 s3_prefix):
    """No staging key and no copy; the same bytes again complete nothing (412) and leave no
    upload behind."""
    body = npy_bytes(np.random.default_rng(1).normal(size=(30, 3)).astype(np.float32))
    declared = {DIGEST_HEADER: hashlib.sha256(body).hexdigest()}
    for _ in range(2):
        response = client.put(URL, params={"evalset": "eval"}, content=body, headers={
            "Content-Type": "application/octet-stream", **declared})
        assert response.status_code in (200, 201), response.text
        assert response.json()["logits_sha256"] == declared[DIGEST_HEADER]
        assert s3.incomplete_uploads(s3_prefix) == []
        assert client.app.state.store.key(declared[DIGEST_HEADER]) in s3.keys(s3_prefix)
        assert not any("/staging/" in key for key in s3.keys(s3_prefix))


@pytest.mark.parametrize(("declared", "code"), [
    (hashlib.sha256(b"other bytes").hexdigest(), "digest_mismatch"),
    ("not-a-digest", "invalid_sha256")])
def test_a_wrong_declared_digest_is_refused_and_stores_nothing(client, registered, s3,
                                                               s3_prefix, declared, code):
    before = s3.keys(s3_prefix)
    response = client.put(URL, params={"evalset": "eval"},
                          content=npy_bytes(np.zeros((30, 3), np.float32)),
                          headers={"Content-Type": "application/octet-stream",
                                   DIGEST_HEADER: declared})
    assert error_code(response, 422) == code
    assert s3.keys(s3_prefix) == before and s3.incomplete_uploads(s3_prefix) == []


def fortran(array: np.ndarray) -> np.ndarray:
    return np.asfortranarray(array)


@pytest.mark.parametrize(("body", "code"), [
    (npy_bytes(np.zeros((29, 3), np.float32)), "logits_shape"),
    (npy_bytes(np.array([[np.nan, 0.0, 0.0]] * 30)), "non_finite"),
    (npy_bytes(np.array([[0.0, 1.0, object()]] * 30, dtype=object)), "object_array"),
    (npy_bytes(np.zeros((30, 3), np.int64)), "logits_dtype"),
    (npy_bytes(np.zeros((30, 3), np.float32))[:-7], "logits_corrupt"),
    (npy_bytes(np.zeros((30, 3), np.float32)) + b"\0" * 8, "logits_corrupt"),
    (b"not an array", "logits_corrupt"),
    (npy_bytes(np.zeros(90, np.float32)), "logits_shape"),
    (npy_bytes(fortran(np.zeros((30, 3), np.float32))), "logits_layout"),
], ids=["rows", "nan", "object", "int", "truncated", "trailing", "junk", "1d", "fortran"])
def test_refused_streamed_logits_store_nothing(client, registered, db, s3, s3_prefix, body,
                                               code):
    """The codes the local store's checks of the whole file give (but `logits_layout`)."""
    before = s3.keys(s3_prefix)
    response = put_raw(client, URL, body, {"evalset": "eval"})
    assert error_code(response, 422) == code
    assert s3.keys(s3_prefix) == before and s3.incomplete_uploads(s3_prefix) == []
    with db() as session:
        assert session.scalars(select(Prediction)).all() == []


def test_an_npz_sent_as_logits_is_refused(client, registered, npz_file, s3, s3_prefix):
    response = put_raw(client, URL, npz_file().read_bytes(), {"evalset": "eval"})
    assert error_code(response, 422) == "logits_not_npy"
    assert s3.incomplete_uploads(s3_prefix) == []


def refused_for_the_store(response) -> None:
    """503 `storage_unavailable` with Retry-After, naming neither bucket nor host."""
    assert error_code(response, 503) == "storage_unavailable"
    assert int(response.headers["retry-after"]) > 0
    assert "127.0.0.1" not in response.text and "flipgate-test" not in response.text


def test_a_store_that_refuses_the_credentials_is_503_and_keeps_nothing(
        client, registered, s3, s3_prefix, monkeypatch, onnx_file, db):
    before = s3.keys(s3_prefix)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    client.app.state.store = open_store(client.app.state.settings)
    logits = np.zeros((30, 3), np.float32)
    refused_for_the_store(put_logits(client, "digits:1.0", "eval", logits))
    refused_for_the_store(post_model(client, "digits", "2.0", onnx_file(seed=1).read_bytes()))
    assert s3.keys(s3_prefix) == before and s3.incomplete_uploads(s3_prefix) == []
    with db() as session:
        assert session.scalars(select(Prediction)).all() == []
    assert client.get("/models/digits/versions/2.0").status_code == 404
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["artifacts"] == {
        "status": "failed", "detail": "does not answer (StorageUnavailable)"}


@pytest.mark.slow
@pytest.mark.serial
def test_a_frozen_store_is_503_within_the_documented_bound(engine, tmp_path, monkeypatch):
    """A store that accepts connections and never answers: each call gives up after
    FLIPGATE_STORE_TIMEOUT_SECONDS per try, ATTEMPTS tries in all, so a request is answered
    within twice the timeout and a second (docs/operations.md; a timeout long enough that a
    third try would show). What the frozen store took in and began once it woke (the
    multipart upload the API gave up on) is aborted by the API then, not left to a sweep."""
    timeout = 3.0
    with s3_server(tmp_path / "s3") as server:
        for name, value in server.aws_env().items():
            monkeypatch.setenv(name, value)
        settings = store_settings(engine, tmp_path).model_copy(update={
            "artifact_store": server.store_url(), "store_timeout_seconds": timeout})
        with rolled_back_client(engine, settings) as client:
            server.freeze()
            started = time.monotonic()
            refused_for_the_store(put_logits(client, "digits:1.0", "eval",
                                             np.zeros((30, 3), np.float32)))
            elapsed = time.monotonic() - started
            server.thaw()
            assert elapsed < ATTEMPTS * timeout + 1.5, elapsed
            time.sleep(1)  # the woken store does what it took in while frozen
            wait_for(lambda: server.incomplete_uploads() == [], "the upload to be aborted",
                     timeout=8 * timeout)
        assert server.keys() == []
