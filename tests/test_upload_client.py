"""`flipgate upload`'s transfer against a recording HTTP server: the body goes out sized
(Content-Length, never chunked) and whole, progress reaches the total, and a server that
refuses before reading the body is answered with its own error. Directly, and through an
HTTP proxy (the httpx path)."""

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from flipgate.errors import InputError
from flipgate.gate_client import Credentials
from flipgate.upload_client import (
    CHUNK_BYTES,
    DIGEST_HEADER,
    DIGEST_WANTED_HEADER,
    put_file,
)


class Recorder(BaseHTTPRequestHandler):
    """Reads a PUT's sized body and answers its length; refuses a request with the wrong
    token before reading anything."""

    seen: ClassVar[list[dict]] = []
    wants_digest: ClassVar[bool] = False  # what /healthz says

    def do_GET(self) -> None:
        if self.path != "/healthz":
            return self.answer(404, {"error": {"code": "not_found", "message": self.path}})
        self.extra = {DIGEST_WANTED_HEADER: "1"} if self.wants_digest else {}
        return self.answer(200, {"status": "ok"})

    def do_PUT(self) -> None:
        if self.headers.get("Authorization") != "Bearer right":
            return self.answer(401, {"error": {"code": "invalid_token", "message": "no"}})
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        return self.answer(201, {"received": len(body)})

    def answer(self, status: int, payload: dict) -> None:
        content = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.send_header("Connection", "close")
        for name, value in getattr(self, "extra", {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def big_file(tmp_path) -> Path:
    path = tmp_path / "logits.npy"
    path.write_bytes(os.urandom(2 * CHUNK_BYTES + 12345))
    return path


@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "through a proxy"])
def test_the_body_goes_sized_and_whole_with_progress(server, big_file, monkeypatch, proxied):
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    if proxied:  # the recorder answers as the proxy would forward
        monkeypatch.setenv("HTTP_PROXY", server)
    Recorder.seen.clear()
    reports = []
    record = put_file(server, "/models/a/versions/1/predictions", big_file,
                      params={"evalset": "e v"}, credentials=Credentials(token="right"),
                      progress=lambda done, total: reports.append((done, total)))
    size = big_file.stat().st_size
    assert record == {"received": size}
    [request] = Recorder.seen
    assert request["headers"]["Content-Length"] == str(size)
    assert "Transfer-Encoding" not in request["headers"]
    assert request["body"] == big_file.read_bytes()
    assert request["path"].endswith("/models/a/versions/1/predictions?evalset=e+v")
    assert reports[-1] == (size, size) and len(reports) >= 2


def test_a_refusal_before_the_body_is_read_is_the_servers_error(server, big_file, monkeypatch):
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    with pytest.raises(InputError) as refused:
        put_file(server, "/evalsets/x", big_file, params={},
                 credentials=Credentials(token="wrong"))
    assert refused.value.code == "invalid_token" and "HTTP 401" in refused.value.message


def test_an_unreachable_server_is_unreachable(big_file, monkeypatch):
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    with pytest.raises(InputError) as failed:
        put_file("http://127.0.0.1:9", "/evalsets/x", big_file, params={},
                 credentials=Credentials(token="right"))
    assert failed.value.code == "unreachable"


@pytest.mark.parametrize("wanted", [False, True], ids=["not wanted", "wanted"])
def test_the_digest_is_declared_only_when_the_server_wants_it(server, big_file, wanted):
    """A server whose store saves a copy with it (its /healthz says so) gets the body's
    sha256; any other gets the body at once, with no pass over the file before it."""
    Recorder.seen.clear()
    Recorder.wants_digest = wanted
    try:
        put_file(server, "/evalsets/e", big_file, params={},
                 credentials=Credentials(token="right"))
    finally:
        Recorder.wants_digest = False
    [request] = Recorder.seen
    expected = hashlib.sha256(big_file.read_bytes()).hexdigest() if wanted else None
    assert request["headers"].get(DIGEST_HEADER) == expected
