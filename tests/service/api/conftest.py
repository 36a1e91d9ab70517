"""An API client per test on the migrated SQLite and PostgreSQL databases of
tests/service/conftest.py.

create_app(settings) builds the real app; only its session factory is rebound to one
connection whose outer transaction the test's end rolls back. The request dependency still
opens, commits and rolls back its own session (each commit releases a savepoint), so every
test sees an empty store without migrating a database per module.
"""

import io
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.auth.service import create_token
from service.config import Settings
from service.db import session_scope
from service.main import create_app
from worker import runtime, tasks

ADMIN_TOKEN = "test-admin-token-0123456789"
ONE_DAY = 86_400.0


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def timed(client: TestClient, path: str, token: str) -> tuple[int, dict, float]:
    """GET `path` with `token`: the status, the JSON body and the seconds it took."""
    started = time.monotonic()
    response = client.get(path, headers=bearer(token))
    return response.status_code, response.json(), time.monotonic() - started


def npy_bytes(array: np.ndarray) -> bytes:
    """The .npy file of an array (pickling allowed here only to build refused uploads)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


@pytest.fixture
def settings(engine, tmp_path) -> Settings:
    return Settings(database_url=engine.url.render_as_string(hide_password=False),
                    data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN)


@contextmanager
def rolled_back_client(engine: Engine, settings: Settings) -> Iterator[TestClient]:
    """A client that sends the admin token, on an app whose sessions share one connection
    (`app.state.connection`) inside a transaction rolled back when the block ends. One
    connection serves one session at a time, so a task run in the test renews no lease: a
    heartbeat thread would open a second session on it (seen under load: a savepoint released
    twice)."""
    app = create_app(settings.model_copy(update={"job_heartbeat_seconds": ONE_DAY}))
    with engine.connect() as connection:
        transaction = connection.begin()
        app.state.connection = connection
        app.state.sessions = sessionmaker(bind=connection, expire_on_commit=False,
                                          join_transaction_mode="create_savepoint")
        with TestClient(app, headers=bearer(ADMIN_TOKEN)) as client:
            yield client
        transaction.rollback()


@pytest.fixture
def client(engine, settings) -> Iterator[TestClient]:
    """A client that sends the admin token, on an app whose work is rolled back afterwards."""
    with rolled_back_client(engine, settings) as client:
        yield client


def worker_context(client: TestClient) -> runtime.WorkerContext:
    """A context for the tasks on the client's sessions, artifact store and Celery app."""
    state = client.app.state
    return runtime.WorkerContext(state.sessions, state.store, state.celery, state.settings)


@pytest.fixture
def worker(client, monkeypatch) -> runtime.WorkerContext:
    """Tasks called in this test run on the client's database (worker_context)."""
    context = worker_context(client)
    monkeypatch.setattr(runtime, "context", lambda: context)
    return context


def measure(client: TestClient, old: str, new: str, evalset: str) -> dict:
    """POST /compare and run the jobs it queued with the worker's tasks, in order; the stored
    report."""
    url, params = f"/compare/{old}/{new}", {"evalset": evalset}
    queued = client.post(url, params=params)
    assert queued.status_code in (200, 202), queued.text
    for job_id in queued.json().get("job_ids", []):
        run_task(client, job_id)
    return client.get(url, params=params).json()


def run_task(client: TestClient, job_id: int) -> None:
    """Run the task of a queued inference, metrics or matrix job in this process, on the
    client's database."""
    task = {"inference": tasks.inference, "metrics": tasks.metrics, "matrix": tasks.matrix}[
        client.get(f"/jobs/{job_id}").json()["kind"]]
    context = worker_context(client)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "context", lambda: context)
        task(job_id)


@pytest.fixture
def db(client) -> Callable[[], AbstractContextManager[Session]]:
    """Opens a committing session inside the client's transaction, for arranging data."""
    return lambda: session_scope(client.app.state.sessions)


@pytest.fixture
def mint(db) -> Callable[..., str]:
    """Creates a stored token with the given scopes and returns its plaintext."""

    def create(*scopes: str) -> str:
        with db() as session:
            return create_token(session=session, name="-".join(scopes), scopes=list(scopes))[1]

    return create


def post_model(client: TestClient, name: str, version: str, content: bytes,
               **fields: str) -> Response:
    """POST /models: `content` (ONNX bytes) registered as `name:version`."""
    return client.post("/models", data={"name": name, "version": version, **fields},
                       files={"artifact": ("model.onnx", content)})


def put_model(client: TestClient, name: str, version: str, content: bytes,
              **fields: str) -> Response:
    """PUT /models/{name}/versions/{version}: the model as the raw body, the other fields in
    the query (the fast path)."""
    return put_raw(client, f"/models/{name}/versions/{version}", content, fields)


def post_evalset(client: TestClient, name: str, path: Path) -> Response:
    return client.post("/evalsets", data={"name": name},
                       files={"data": ("data.npz", path.read_bytes())})


def put_evalset(client: TestClient, name: str, path: Path) -> Response:
    """PUT /evalsets/{name}: the .npz as the raw body (the fast path)."""
    return put_raw(client, f"/evalsets/{name}", path.read_bytes(), {})


def put_logits(client: TestClient, ref: str, evalset: str, logits: np.ndarray) -> Response:
    """The logits as the raw body of a PUT (the fast path)."""
    name, version = ref.split(":")
    return put_raw(client, f"/models/{name}/versions/{version}/predictions",
                   npy_bytes(logits), {"evalset": evalset})


def put_raw(client: TestClient, url: str, content: bytes, params: dict[str, str]) -> Response:
    """A file as the raw body of a PUT."""
    return client.put(url, params=params, content=content,
                      headers={"Content-Type": "application/octet-stream"})


def post_logits(client: TestClient, ref: str, evalset: str, logits: np.ndarray) -> Response:
    name, version = ref.split(":")
    return client.post(f"/models/{name}/versions/{version}/predictions",
                       data={"evalset": evalset},
                       files={"logits": ("logits.npy", npy_bytes(logits))})


def both_ways(post: Callable[..., Response], put: Callable[..., Response]) -> Callable:
    """A fixture that gives `post`, then `put`: a module that sets send_model or send_evalset
    to it runs its uploads as multipart POSTs and as raw PUTs."""

    @pytest.fixture(params=[post, put], ids=["multipart", "raw"])
    def sender(request: pytest.FixtureRequest) -> Callable[..., Response]:
        return request.param

    return sender


@pytest.fixture
def send_model() -> Callable[..., Response]:
    """How upload_model sends: by POST (a module overrides this to run both ways)."""
    return post_model


@pytest.fixture
def send_evalset() -> Callable[..., Response]:
    """How upload_evalset sends: by POST (a module overrides this to run both ways)."""
    return post_evalset


@pytest.fixture
def upload_model(client, onnx_file, send_model) -> Callable[..., Response]:
    """Sends a linear ONNX classifier as `name:version`."""

    def send(name: str, version: str, *, num_classes: int = 3, seed: int = 0,
             content: bytes | None = None, **fields: str) -> Response:
        data = content if content is not None else onnx_file(num_classes, seed).read_bytes()
        return send_model(client, name, version, data, **fields)

    return send


@pytest.fixture
def upload_evalset(client, send_evalset) -> Callable[[str, Path], Response]:
    return lambda name, path: send_evalset(client, name, path)


@pytest.fixture
def upload_logits(client) -> Callable[..., Response]:
    return lambda ref, evalset, logits: post_logits(client, ref, evalset, logits)


def error_code(response: Response, status: int) -> str:
    """The code of an error response, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return body["error"]["code"]
