"""A real `flipgate serve` for the load tests (embedded: SQLite and the folder broker, with
its own TMPDIR), and raw requests whose bodies are sent only in part: a client that
streams slowly, or stops."""

import http.client
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from flipgate.processes import free_port
from service.config import Settings
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for

TOKEN = "load-admin-token-0123456789"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}
BOUNDARY = "flipgate-load"
# a multipart body's first bytes: the eval set's file part opens, and its content follows
FILE_PART = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="data"; '
             'filename="eval.npz"\r\nContent-Type: application/octet-stream\r\n\r\n').encode()


@dataclass(frozen=True)
class Server:
    """A running `flipgate serve`: its address, process, settings (data dir, database) and
    TMPDIR, where a request body larger than a megabyte would be spooled."""

    url: str
    port: int
    process: subprocess.Popen
    settings: Settings
    tmp_dir: Path


@contextmanager
def serving(tmp_path: Path, *args: str, **variables: str) -> Iterator[Server]:
    """`flipgate serve ARGS` on a free port with TOKEN as its admin token (and the extra
    environment `variables`), once ready; terminated at the end if it still runs."""
    port, data_dir, tmp_dir = free_port(), tmp_path / "data", tmp_path / "tmp"
    tmp_dir.mkdir()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(data_dir), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       TMPDIR=str(tmp_dir), **variables)
    url = f"http://127.0.0.1:{port}"
    with flipgate_process(["serve", "--port", str(port), *args], env, tmp_path) as process:
        wait_for(lambda: _ready(url), "/readyz", 60)
        yield Server(url, port, process, Settings(data_dir=data_dir, database_url=""), tmp_dir)


@pytest.fixture
def api_server(tmp_path) -> Iterator[Server]:
    """`flipgate serve --api-only`."""
    with serving(tmp_path, "--api-only") as server:
        yield server


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz").status_code == 200
    except httpx.TransportError:
        return False


def partial_upload(server: Server, *, declared: int, headers: dict[str, str],
                   sent: int = 64 * 1024) -> socket.socket:
    """A POST /evalsets whose headers declare a multipart body of `declared` bytes, of which
    only the first `sent` are sent; its connection, left open."""
    head = ["POST /evalsets HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {declared}",
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
            *(f"{name}: {value}" for name, value in headers.items())]
    connection = socket.create_connection(("127.0.0.1", server.port))
    first = FILE_PART + b"\0" * (sent - len(FILE_PART))
    connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + first)
    return connection


def read_response(connection: socket.socket, timeout: float) -> http.client.HTTPResponse:
    """The response that comes back on a raw connection within `timeout` seconds."""
    connection.settimeout(timeout)
    response = http.client.HTTPResponse(connection)
    response.begin()
    return response
