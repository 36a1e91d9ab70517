"""A raw PUT of logits into an S3 store that stops midway, on a real `flipgate serve` and a
real SeaweedFS: a client that goes away leaves no object and no incomplete multipart upload
in the bucket; a store that freezes mid-upload is answered 503 within the documented bound."""

import socket
import time

import pytest

from service.storage.s3 import ABORT_WAIT_SECONDS, ATTEMPTS
from tests.e2e.conftest import wait_for
from tests.load.conftest import AUTHORIZED, read_response, serving
from tests.s3server import s3_server

SENT_BYTES = 40 << 20  # several 8 MiB parts reach the bucket before the client goes away


@pytest.mark.slow
def test_a_client_that_disconnects_mid_upload_leaves_nothing_in_the_bucket(tmp_path, s3,
                                                                           s3_prefix):
    with serving(tmp_path, "--api-only",
                 **s3.flipgate_env(s3_prefix)) as server:
        connection = begin_put(server.port)
        wait_for(lambda: s3.incomplete_uploads(s3_prefix), "the upload to begin")
        connection.close()
        wait_for(lambda: not s3.incomplete_uploads(s3_prefix), "the upload to be aborted")
        assert s3.keys(s3_prefix) == []
        assert not (server.settings.data_dir / "artifacts").exists()


def begin_put(port: int) -> socket.socket:
    """A raw PUT of logits declaring twice SENT_BYTES, of which SENT_BYTES are sent."""
    head = ["PUT /models/digits/versions/1/predictions?evalset=eval HTTP/1.1",
            "Host: 127.0.0.1", f"Content-Length: {2 * SENT_BYTES}",
            "Content-Type: application/octet-stream",
            *(f"{name}: {value}" for name, value in AUTHORIZED.items())]
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    for _ in range(SENT_BYTES >> 20):
        connection.sendall(b"\0" * (1 << 20))
    return connection


@pytest.mark.slow
@pytest.mark.serial
def test_a_store_frozen_mid_upload_is_503_within_the_bound(tmp_path):
    timeout = 1.0
    with s3_server(tmp_path / "s3") as store, serving(
            tmp_path, "--api-only", FLIPGATE_STORE_TIMEOUT_SECONDS=str(timeout),
            **store.flipgate_env()) as server:
        connection = begin_put(server.port)
        wait_for(store.incomplete_uploads, "the upload to begin")
        store.freeze()
        frozen = time.monotonic()
        try:
            connection.sendall(b"\0" * SENT_BYTES)  # the rest: parts wait for the store
            response = read_response(connection, timeout=30)
            waited = time.monotonic() - frozen
        finally:
            store.thaw()
        assert response.status == 503 and response.getheader("Retry-After") == "5"
        assert b"storage_unavailable" in response.read()
        # parts in flight each give up within ATTEMPTS tries of the timeout (and a backoff
        # under a second); the abort is waited for ABORT_WAIT_SECONDS at most
        assert waited < ATTEMPTS * (timeout + 1) + ABORT_WAIT_SECONDS + 8, waited
        wait_for(lambda: not store.incomplete_uploads(), "the upload to be aborted")
        assert not any(key.startswith("sha256/") for key in store.keys(""))
