"""The S3 server the suite starts (tests/s3server.py) behaves as the fault tests assume: one
bucket served to one key, another key refused, a frozen server accepting connections and never
answering, and a restarted one keeping its objects."""

import socket

import pytest
from botocore.exceptions import ClientError

from tests.s3server import s3_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def test_the_bucket_serves_its_key_and_refuses_another(server, s3_prefix):
    server.client().put_object(Bucket=server.bucket, Key=f"{s3_prefix}/a", Body=b"bytes")
    assert server.keys(s3_prefix) == [f"{s3_prefix}/a"]
    server.secret_key, right = "wrong", server.secret_key
    try:
        with pytest.raises(ClientError) as refused:
            server.client().head_bucket(Bucket=server.bucket)
    finally:
        server.secret_key = right
    assert refused.value.response["Error"]["Code"] == "403"


def test_a_frozen_server_accepts_connections_and_never_answers(server):
    server.freeze()
    try:
        with socket.create_connection(("127.0.0.1", server.ports["s3"]), timeout=2) as sock:
            sock.settimeout(1)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: s3\r\n\r\n")
            with pytest.raises(TimeoutError):
                sock.recv(1)
    finally:
        server.thaw()
    assert server.client().head_bucket(Bucket=server.bucket)


def test_a_restarted_server_keeps_its_objects(server, s3_prefix):
    server.client().put_object(Bucket=server.bucket, Key=f"{s3_prefix}/kept", Body=b"kept")
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.ports["s3"]), timeout=2).close()
    server.start()
    body = server.client().get_object(Bucket=server.bucket, Key=f"{s3_prefix}/kept")["Body"]
    assert body.read() == b"kept"


def test_a_multipart_upload_is_listed_until_it_is_aborted(server, s3_prefix):
    """What the disconnect tests look for: a begun upload shows until it is aborted."""
    client, key = server.client(), f"{s3_prefix}/partial"
    upload = client.create_multipart_upload(Bucket=server.bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=server.bucket, Key=key, UploadId=upload, PartNumber=1,
                       Body=b"x" * 1024)
    assert server.incomplete_uploads(s3_prefix) == [key]
    assert server.keys(s3_prefix) == []
    client.abort_multipart_upload(Bucket=server.bucket, Key=key, UploadId=upload)
    assert server.incomplete_uploads(s3_prefix) == []
