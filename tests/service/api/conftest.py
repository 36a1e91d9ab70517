"""An API client per test on the migrated SQLite and PostgreSQL databases of
tests/service/conftest.py.

create_app(settings) builds the real app; only its session factory is rebound to one
connection whose outer transaction the test's end rolls back. The request dependency still
opens, commits and rolls back its own session (each commit releases a savepoint), so every
test sees an empty store without migrating a database per module.

A module whose tests start from the same seeded line builds one app per database instead
(`shared_store`, a ModuleStore): seeded once, each test in a savepoint rolled back at its end.
"""

import io
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from celery import Celery
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import Engine, NestedTransaction
from sqlalchemy.orm import Session, sessionmaker

from service.auth.service import create_token
from service.config import Settings
from service.main import create_app
from tests.service.conftest import default_session, drop_flipgate_environment
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


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """The .npz file of named arrays."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def import_labels(client: TestClient, evalset: str, content: bytes,
                  filename: str = "labels.npz") -> Response:
    """POST labels to a traffic set and run the metrics jobs they queued; the answer."""
    response = client.post(f"/evalsets/{evalset}/labels", files={"labels": (filename, content)})
    for job_id in response.json().get("job_ids", []) if response.status_code < 300 else []:
        run_task(client, job_id)
    return response


def store_settings(engine: Engine, folder: Path) -> Settings:
    """The settings of a test app on `engine`'s database, its files under `folder`, made
    without the FLIPGATE_* variables of the environment (as every test's are)."""
    with pytest.MonkeyPatch.context() as patch:
        drop_flipgate_environment(patch)
        return Settings(database_url=engine.url.render_as_string(hide_password=False),
                        data_dir=folder / "data", admin_token=ADMIN_TOKEN)


@pytest.fixture
def settings(engine, tmp_path) -> Settings:
    return store_settings(engine, tmp_path)


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
        app.state.sessions = app.state.readers = sessionmaker(
            bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint")
        with TestClient(app, headers=bearer(ADMIN_TOKEN)) as client:
            yield client
        transaction.rollback()


@pytest.fixture
def client(engine, settings) -> Iterator[TestClient]:
    """A client that sends the admin token, on an app whose work is rolled back afterwards."""
    with rolled_back_client(engine, settings) as client:
        yield client


Seed = Callable[[TestClient, Path], Any]


class ModuleStore:
    """One rolled-back app and connection that a module's tests share (per database): each
    test runs in a savepoint rolled back at its end, on the store as a seed left it. The seed
    runs in a savepoint of its own, once for as long as consecutive tests ask for it; a test
    that asks for another seed, or none, has it rolled back first."""

    def __init__(self, client: TestClient, settings: Settings, folder: Path) -> None:
        self.client, self.settings, self.folder = client, settings, folder
        self.seed: Seed | None = None
        self.seeded: Any = None  # what the seed returned
        self._seed_savepoint: NestedTransaction | None = None

    @contextmanager
    def client_for_test(self, seed: Seed | None) -> Iterator[TestClient]:
        """The shared client on the store as `seed` leaves it (empty for None) until the block
        ends; then its writes (failed sign-ins included), queued messages, headers, cookies
        and settings are undone."""
        self._seeded_with(seed)
        app = self.client.app
        settings = app.state.settings.model_copy(deep=True)
        headers = self.client.headers.copy()
        savepoint = app.state.connection.begin_nested()
        try:
            yield self.client
        finally:
            savepoint.rollback()
            for field in type(settings).model_fields:  # in place: the middleware holds it
                setattr(app.state.settings, field, getattr(settings, field))
            self.client.headers = headers
            self.client.cookies.clear()
            drop_queued_messages(app.state.celery)

    def _seeded_with(self, seed: Seed | None) -> None:
        if seed is self.seed and (seed is None) == (self._seed_savepoint is None):
            return
        if self._seed_savepoint is not None:
            self._seed_savepoint.rollback()
        self.seed, self.seeded, self._seed_savepoint = None, None, None
        if seed is None:
            return
        self._seed_savepoint = self.client.app.state.connection.begin_nested()
        self.seeded, self.seed = seed(self.client, self.folder), seed


def drop_queued_messages(celery: Celery) -> None:
    """Empty the folder broker's queues: what a test sent is not the next test's."""
    for message in Path(celery.conf.broker_transport_options["data_folder_in"]).iterdir():
        message.unlink()


@pytest.fixture(scope="module")
def module_store(engine, tmp_path_factory) -> Iterator[ModuleStore]:
    """The module's shared store on each database (see `shared_store`)."""
    folder = tmp_path_factory.mktemp("module_store")
    settings = store_settings(engine, folder)
    with rolled_back_client(engine, settings) as shared:
        yield ModuleStore(shared, settings, folder)


def shared_store(**seeds: Seed) -> tuple[Callable, Callable]:
    """The `client` and `settings` fixtures of a module whose tests share one app per database
    (ModuleStore): a test starts from exactly the store that `seeds[name](client, folder)`
    seeded, for the first `name` among the fixtures it uses (`client=`: every test), or from
    an empty store if it uses none of them; each seed runs once for consecutive tests, not
    once per test. `module_store.seeded` is what the seed returned. `db`, `mint`, `worker` and
    the upload fixtures work on the shared client."""

    @pytest.fixture(name="client")
    def shared_client(request: pytest.FixtureRequest,
                      module_store: ModuleStore) -> Iterator[TestClient]:
        seed = next((seed for name, seed in seeds.items() if name in request.fixturenames),
                    None)
        with module_store.client_for_test(seed) as client:
            yield client

    @pytest.fixture(name="settings")
    def shared_settings(module_store: ModuleStore) -> Settings:
        return module_store.settings

    return shared_client, shared_settings


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
    """Opens a committing session inside the client's transaction, for arranging data, bound
    to the project `default`."""
    return lambda: default_session(client.app.state.sessions)


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
