"""A stopped or frozen S3 store answers and stores nothing: `flipgate serve --api-only`
(SQLite, the folder broker) as a process, on a SeaweedFS of its own (tests/s3server.py) that
the tests stop and restart, or freeze (SIGSTOP: connections accepted, never answered) and
thaw. Each upload (a multipart eval set, staged locally, and a raw PUT of logits, streamed
into the store) answers 503 `storage_unavailable` with Retry-After within the documented
bound and leaves no row and no artifact; /readyz names the store failed without naming the
bucket, host or prefix; once the store is back, the API serves again. (A refused key and a
client gone mid-upload: tests/service/api/test_s3_store_api.py, tests/load/.)"""

import io
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from flipgate.processes import free_port
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for
from tests.s3server import S3Server, s3_server

TOKEN = "e2e-store-faults-admin-token-0123"
SHARED_KEYS = {"FLIPGATE_SECRET_KEY": "e2e-store-faults-secret-key-0123456789",
               "FLIPGATE_SESSION_KEY": "e2e-store-faults-session-key-0123456789"}
TIMEOUT_SECONDS = 1.0  # FLIPGATE_STORE_TIMEOUT_SECONDS
# docs/operations.md, "When the store fails": two tries of the timeout plus a second, and at
# most 2 s more for a streamed upload's abort
BOUND_SECONDS = 2 * TIMEOUT_SECONDS + 1 + 2
SLACK_SECONDS = 2.0  # a loaded 2-core machine's scheduling, not the store's
ROWS, CLASSES = 2000, 10
PREFIX = "faults-prefix"
pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[S3Server]:
    """A SeaweedFS these tests alone use (they stop and freeze it)."""
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@dataclass
class Api:
    """A running API process: a client sending the admin token, and its SQLite database."""

    client: httpx.Client
    database: Path

    def rows(self) -> tuple[int, int]:
        """(eval sets named `lost`, predictions) in the database."""
        with closing(sqlite3.connect(self.database)) as connection:
            return (connection.execute("SELECT count(*) FROM datasets WHERE name = 'lost'")
                    .fetchone()[0],
                    connection.execute("SELECT count(*) FROM predictions").fetchone()[0])


@pytest.fixture(scope="module")
def served(store, tmp_path_factory) -> Iterator[Api]:
    """`flipgate serve --api-only` on the store, its SQLite database in its folder, with the
    line and eval set `faults` registered."""
    folder = tmp_path_factory.mktemp("api")
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(folder / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_STORE_TIMEOUT_SECONDS=str(TIMEOUT_SECONDS), **SHARED_KEYS,
                       **store.flipgate_env(PREFIX))
    with (flipgate_process(["serve", "--api-only", "--port", str(port)], env, folder),
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: answers(client), "/healthz")
        register(client)
        yield Api(client, folder / "data" / "flipgate.db")


def answers(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def register(client: httpx.Client) -> None:
    """The eval set `faults` (ROWS labels) and the line `faults` (two external versions of
    CLASSES classes)."""
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((ROWS, 1), np.float32), y=np.arange(ROWS) % CLASSES)
    assert client.post("/evalsets", data={"name": "faults"},
                       files={"data": ("faults.npz", buffer.getvalue())}).status_code == 201
    for version in ("1", "2"):
        assert client.post("/models", data={"name": "faults", "version": version,
                                            "num_classes": str(CLASSES)}).status_code == 201


def npy_bytes(seed: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(seed).normal(size=(ROWS, CLASSES)).astype(np.float32))
    return buffer.getvalue()


def uploads(client: httpx.Client) -> dict[str, Callable[[], httpx.Response]]:
    """A new eval set (multipart form: staged, then stored) and logits by raw PUT (streamed
    into the store), each of bytes the store has never seen."""
    seed = time.time_ns() % 2**32
    evalset = io.BytesIO()
    np.savez(evalset, x=np.random.default_rng(seed).normal(size=(ROWS, 1)).astype(np.float32),
             y=np.arange(ROWS) % CLASSES)
    logits = npy_bytes(seed)
    return {
        "multipart eval set": lambda: client.post(
            "/evalsets", data={"name": "lost"},
            files={"data": ("lost.npz", evalset.getvalue())}),
        "raw PUT of logits": lambda: client.put(
            "/models/faults/versions/1/predictions", params={"evalset": "faults"},
            content=logits, headers={"Content-Type": "application/octet-stream"})}


def assert_unavailable_in_time(client: httpx.Client) -> None:
    for upload, send in uploads(client).items():
        started = time.monotonic()
        response = send()
        elapsed = time.monotonic() - started
        assert response.status_code == 503, (upload, response.text)
        assert response.json()["error"]["code"] == "storage_unavailable", upload
        assert 0 < int(response.headers["Retry-After"]) <= 60, upload
        assert elapsed <= BOUND_SECONDS + SLACK_SECONDS, (upload, elapsed)


def assert_ready_names_the_store_only(client: httpx.Client, store: S3Server) -> None:
    """/readyz: the store failed, told by the error's type; no bucket, host, port or key."""
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["artifacts"]["status"] == "failed"
    for secret in (store.bucket, "127.0.0.1", str(store.ports["s3"]), PREFIX):
        assert secret not in response.text


def assert_nothing_stored(running: Api, store: S3Server, keys_before: list[str]) -> None:
    """No row, and once the healed store has done what it had been sent, no new artifact:
    what a frozen store took in before the API gave up is at most a staging object or upload
    (under PREFIX/staging/, left to the sweep of abandoned uploads)."""
    assert running.rows() == (0, 0)
    store.client().head_bucket(Bucket=store.bucket)
    new = set(store.keys()) - set(keys_before)
    assert all(key.startswith(f"{PREFIX}/staging/") for key in new), new
    assert all(key.startswith(f"{PREFIX}/staging/") for key in store.incomplete_uploads())


FAULTS = {"stopped": (S3Server.stop, S3Server.start),
          "frozen": (S3Server.freeze, S3Server.thaw)}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_stopped_or_frozen_store_answers_503_within_the_bound_and_stores_nothing(
        fault, store, served):
    before = store.keys()
    breaks, heals = FAULTS[fault]
    breaks(store)
    try:
        assert_unavailable_in_time(served.client)
        assert_ready_names_the_store_only(served.client, store)
    finally:
        heals(store)
    assert_nothing_stored(served, store, before)
    assert served.client.get("/readyz").status_code == 200  # and it serves again
