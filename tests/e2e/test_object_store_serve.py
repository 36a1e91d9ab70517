"""`flipgate serve --api-only` (SQLite, the folder broker) as a process, on a SeaweedFS of its
own (tests/s3server.py). Its memory during a large raw PUT into the bucket stays within a few
of the upload's parts. A stopped or frozen store answers and stores nothing: the tests stop
and restart it, or freeze it (SIGSTOP: connections accepted, never answered) and thaw it.
Each upload (a multipart eval set, staged locally, and a raw PUT of logits, streamed into
the store) answers 503 `storage_unavailable` with Retry-After within the documented bound
and leaves no row and no artifact; /readyz names the store failed without naming the
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
from service.storage.s3 import PART_BYTES, PARTS_IN_FLIGHT
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for
from tests.s3server import S3Server, s3_server

TOKEN = "e2e-store-faults-admin-token-0123"
# FLIPGATE_STORE_TIMEOUT_SECONDS: long enough for a 32 MiB part copy of the large upload (over
# 2 s, twice in a row, for SeaweedFS on this 2-core machine at a load average of 15)
TIMEOUT_SECONDS = 3.0
# docs/operations.md, "When the store fails": two tries of the timeout plus a second, and at
# most 2 s more for a streamed upload's abort
BOUND_SECONDS = 2 * TIMEOUT_SECONDS + 1 + 2
SLACK_SECONDS = 2.0  # a loaded 2-core machine's scheduling, not the store's
ROWS, CLASSES = 2000, 10
PREFIX = "faults-prefix"
LARGE_MIB = 256
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
    pid: int

    def rows(self) -> tuple[int, int]:
        """(eval sets named `lost`, predictions on the eval set `faults`) in the database."""
        with closing(sqlite3.connect(self.database)) as connection:
            return (connection.execute("SELECT count(*) FROM datasets WHERE name = 'lost'")
                    .fetchone()[0],
                    connection.execute("SELECT count(*) FROM predictions JOIN datasets ON "
                                       "predictions.dataset_id = datasets.id WHERE "
                                       "datasets.name = 'faults'").fetchone()[0])


@pytest.fixture(scope="module")
def served(store, tmp_path_factory) -> Iterator[Api]:
    """`flipgate serve --api-only` on the store, its SQLite database in its folder, with the
    line and eval set `faults` registered."""
    folder = tmp_path_factory.mktemp("api")
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(folder / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_STORE_TIMEOUT_SECONDS=str(TIMEOUT_SECONDS),
                       **store.flipgate_env(PREFIX))
    with (flipgate_process(["serve", "--api-only", "--port", str(port)], env, folder) as process,
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: answers(client), "/healthz")
        register(client)
        yield Api(client, folder / "data" / "flipgate.db", process.pid)


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


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM) in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM"))) / 1024


def write_logits(path: Path, rows: int, classes: int) -> Path:
    """A float32 (rows, classes) .npy written a block at a time."""
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, classes)}
    block = np.random.default_rng(0).normal(size=(4096, classes)).astype(np.float32)
    with path.open("wb") as file:
        np.lib.format.write_array_header_2_0(file, header)
        for start in range(0, rows, len(block)):
            file.write(block[:rows - start].tobytes())
    return path


def test_the_apis_memory_during_a_large_streamed_upload_stays_within_a_few_parts(
        served, tmp_path):
    """A 256 MiB raw PUT into the bucket raises the API's peak RSS by less than twice the
    parts in flight and the one being filled (their bytes, and the copy a request body is
    made of), however large the upload (benchmarks/store_bench.py: 2 GiB)."""
    rows, classes = LARGE_MIB * 2**20 // 4000, 1000
    evalset = io.BytesIO()
    np.savez(evalset, x=np.zeros((rows, 1), np.float32), y=np.arange(rows) % classes)
    assert served.client.post("/evalsets", data={"name": "large"},
                              files={"data": ("large.npz", evalset.getvalue())}).is_success
    assert served.client.post("/models", data={"name": "large", "version": "1",
                                               "num_classes": str(classes)}).is_success
    logits = write_logits(tmp_path / "large.npy", rows, classes)
    before = peak_rss_mib(served.pid)
    with logits.open("rb") as body:
        stored = served.client.put("/models/large/versions/1/predictions",
                                   params={"evalset": "large"}, content=body,
                                   headers={"Content-Type": "application/octet-stream"})
    assert stored.status_code == 201, stored.text
    parts = 2 * (PARTS_IN_FLIGHT + 1)
    assert peak_rss_mib(served.pid) - before < parts * PART_BYTES / 2**20


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
