"""A client that goes away in the middle of a raw PUT of logits into an S3 store leaves no
object and no incomplete multipart upload in the bucket (a real `flipgate serve` on a real
SeaweedFS)."""

import socket

import pytest

from tests.e2e.conftest import wait_for
from tests.load.conftest import AUTHORIZED, serving

SENT_BYTES = 40 << 20  # several 8 MiB parts reach the bucket before the client goes away


@pytest.mark.slow
def test_a_client_that_disconnects_mid_upload_leaves_nothing_in_the_bucket(tmp_path, s3,
                                                                           s3_prefix):
    with serving(tmp_path, "--api-only", **s3.flipgate_env(s3_prefix)) as server:
        head = ["PUT /models/digits/versions/1/predictions?evalset=eval HTTP/1.1",
                "Host: 127.0.0.1", f"Content-Length: {2 * SENT_BYTES}",
                "Content-Type: application/octet-stream",
                *(f"{name}: {value}" for name, value in AUTHORIZED.items())]
        connection = socket.create_connection(("127.0.0.1", server.port))
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        for _ in range(SENT_BYTES >> 20):
            connection.sendall(b"\0" * (1 << 20))
        wait_for(lambda: s3.incomplete_uploads(s3_prefix), "the upload to begin")
        connection.close()
        wait_for(lambda: not s3.incomplete_uploads(s3_prefix), "the upload to be aborted")
        assert s3.keys(s3_prefix) == []
        assert not (server.settings.data_dir / "artifacts").exists()
