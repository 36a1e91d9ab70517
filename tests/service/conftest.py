"""Real databases for the store tests: a SQLite file and a PostgreSQL schema, each migrated
once per test session; every test runs in a transaction that is rolled back afterwards."""

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.datasets.models import Dataset
from service.db import create_db_engine, session_scope
from service.migrate import upgrade
from service.predictions.models import Prediction, PredictionSource
from service.predictions.service import check_logits_file, store_logits_file
from service.projects.models import DEFAULT_PROJECT
from service.projects.scoping import scope_session
from service.projects.service import get_project
from service.registry.models import ModelVersion
from service.storage import ArtifactStore, LocalStore, open_store
from tests.conftest import linear_onnx
from tests.s3server import SHARED_KEYS

POSTGRES_URL = os.environ.get("FLIPGATE_TEST_DATABASE_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
FEATURES = 4


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A new, uniquely named schema in the test database, dropped afterwards; yields a URL
    whose connections use it. Unreachable PostgreSQL fails the tests in CI, else skips them."""
    server = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
    schema = f"flipgate_test_{uuid.uuid4().hex[:12]}"
    try:
        with server.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as error:
        server.dispose()
        message = f"PostgreSQL at {POSTGRES_URL} is unreachable: {error.orig}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI must test PostgreSQL)", pytrace=False)
        pytest.skip(message)
    try:
        yield make_url(POSTGRES_URL).update_query_dict(
            {"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with server.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        server.dispose()


def drop_flipgate_environment(patch: pytest.MonkeyPatch) -> None:
    """Remove the FLIPGATE_* variables from the environment until `patch` is undone."""
    for name in [name for name in os.environ if name.startswith("FLIPGATE_")]:
        patch.delenv(name)


@pytest.fixture(autouse=True)
def no_flipgate_environment(monkeypatch) -> None:
    """Settings in these tests come from their arguments, not from FLIPGATE_* variables."""
    drop_flipgate_environment(monkeypatch)


BACKENDS = ["sqlite", "postgresql"]


@contextmanager
def empty_database(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a new, empty database of `backend` (a SQLite file or a PostgreSQL schema)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'store.db'}"
        return
    with postgres_schema() as url:
        yield url


@contextmanager
def migrated_engine(database_url: str) -> Iterator[Engine]:
    """An engine on the database, migrated to the newest revision."""
    settings = Settings(database_url=database_url)
    upgrade(settings)
    engine = create_db_engine(settings)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request, tmp_path_factory) -> Iterator[str]:
    """The URL of an empty database of each backend, kept for the whole test session."""
    with empty_database(request.param, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="session")
def engine(database_url) -> Iterator[Engine]:
    """An engine on the database, migrated to the newest revision; every test's work on it is
    rolled back, so each module finds it empty."""
    with migrated_engine(database_url) as engine:
        yield engine


@pytest.fixture
def session(engine) -> Iterator[Session]:
    """A session bound to the project `default` whose work, commits included, is rolled back
    when the test ends."""
    with engine.connect() as connection:
        transaction = connection.begin()
        session = Session(bind=connection, join_transaction_mode="create_savepoint")
        yield in_default_project(session)
        session.close()
        transaction.rollback()


def in_default_project(session: Session) -> Session:
    """`session`, bound to the project `default` (as a request of a default-bound token)."""
    return scope_session(session, get_project(session=session, name=DEFAULT_PROJECT).id)


@contextmanager
def default_session(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """session_scope(sessions), bound to the project `default`."""
    with session_scope(sessions) as session:
        yield in_default_project(session)


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return LocalStore(tmp_path / "artifacts")


@pytest.fixture
def s3_settings(s3, s3_prefix, tmp_path, monkeypatch) -> Settings:
    """Settings whose artifact store is a prefix of its own in the suite's S3 server (the
    AWS chain pointed at it through the environment, as an operator would)."""
    for name, value in s3.aws_env().items():
        monkeypatch.setenv(name, value)
    return Settings(data_dir=tmp_path / "s3-data", artifact_store=s3.store_url(s3_prefix),
                    **SHARED_KEYS)


def bundle_files(folder: Path) -> dict[str, Path]:
    """A model and its external data written in `folder`, by their names in a bundle."""
    files = {"model.onnx": folder / "m.onnx", "model.onnx.data": folder / "d"}
    files["model.onnx"].write_bytes(b"graph")
    files["model.onnx.data"].write_bytes(b"weights")
    return files


def store_of_kind(kind: str, request: pytest.FixtureRequest, folder: Path) -> ArtifactStore:
    """The local store in `folder` ("local"), or one of its own in the S3 server ("s3")."""
    if kind == "local":
        return LocalStore(folder / "artifacts")
    return open_store(request.getfixturevalue("s3_settings"))


@pytest.fixture(params=["local", "s3"])
def each_store(request, tmp_path) -> ArtifactStore:
    """The local store, then one in the S3 server (for the tests of the interface)."""
    return store_of_kind(request.param, request, tmp_path)


@pytest.fixture
def other_store(each_store, request, tmp_path) -> ArtifactStore:
    """A store of the back-end `each_store` is not (copies between the two)."""
    other = "s3" if isinstance(each_store, LocalStore) else "local"
    return store_of_kind(other, request, tmp_path / "other")


def linear_weights(num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights and bias of a linear classifier on FEATURES inputs."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(FEATURES, num_classes)), rng.normal(size=num_classes)


def write_onnx(folder: Path, num_classes: int = 3, seed: int = 0) -> Path:
    """A linear ONNX classifier with FEATURES inputs, written in `folder`."""
    weight, bias = linear_weights(num_classes, seed)
    return linear_onnx(folder / f"linear-{num_classes}-{seed}.onnx", weight, bias,
                       ("N", FEATURES))


def write_npz(folder: Path, n: int = 30, num_classes: int = 3, seed: int = 0) -> Path:
    """An eval set .npz in `folder`: `n` samples of FEATURES floats, labels < num_classes."""
    rng = np.random.default_rng(seed)
    path = folder / f"set-{n}-{num_classes}-{seed}.npz"
    np.savez(path, x=rng.normal(size=(n, FEATURES)).astype(np.float32),
             y=np.arange(n) % num_classes)
    return path


def store_logits(session: Session, store: ArtifactStore, version: ModelVersion, dataset: Dataset,
                 logits: np.ndarray, *, source: PredictionSource = PredictionSource.COMPUTED,
                 provider: str | None = None) -> Prediction:
    """Keep `logits` of `version` on `dataset` the way the server does: written to an .npy in
    the store's scratch folder, checked, stored (service.predictions)."""
    with store.scratch() as folder:
        path = folder / "logits.npy"
        np.save(path, logits)
        checked = check_logits_file(version=version, dataset=dataset, npy_path=path)
        return store_logits_file(session=session, store=store, version=version,
                                 dataset=dataset, logits=checked, source=source,
                                 provider=provider)


@pytest.fixture
def onnx_file(tmp_path) -> Callable[..., Path]:
    """Writes a linear ONNX classifier with FEATURES inputs and returns its path."""
    return lambda num_classes=3, seed=0: write_onnx(tmp_path, num_classes, seed)


@pytest.fixture
def npz_file(tmp_path) -> Callable[..., Path]:
    """Writes an eval set .npz with `n` samples of FEATURES floats and labels < num_classes."""
    return lambda n=30, num_classes=3, seed=0: write_npz(tmp_path, n, num_classes, seed)
