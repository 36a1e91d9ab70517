"""A database that cannot be reached answers 503 `database_unavailable` within a bound, on
every path: the token lookup of the admission middleware, an endpoint, and /readyz, which
answers after its checks' bound (0.8 s; about 0.9 s here, alone), never after the connect's
3 s. "Frozen" is a port that accepts connections and never answers (as
a PostgreSQL stopped with SIGSTOP does for new connections); "stopped" refuses them."""

import socket
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flipgate.processes import free_port
from service.config import Settings
from service.db import CONNECT_SECONDS
from service.health import CHECK_SECONDS
from service.main import create_app
from tests.service.api.conftest import ADMIN_TOKEN, timed

pytestmark = pytest.mark.serial  # bounds how long a request waits
SLACK_SECONDS = 1.5  # a loaded test machine's scheduling (1.35 s seen after the parallel run)


@pytest.fixture(params=["frozen", "stopped"])
def unreachable_database(request) -> Iterator[str]:
    """The URL of a PostgreSQL that never answers (frozen) or refuses connections (stopped)."""
    port = free_port()
    listener = None
    if request.param == "frozen":
        listener = socket.create_server(("127.0.0.1", port), backlog=64)  # never accepts
    yield f"postgresql+psycopg://flipgate@127.0.0.1:{port}/flipgate"
    if listener is not None:
        listener.close()


@pytest.fixture
def client(unreachable_database, tmp_path) -> TestClient:
    """A client of an app on that database (its start-up check is not run)."""
    settings = Settings(database_url=unreachable_database, data_dir=tmp_path / "data",
                        admin_token=ADMIN_TOKEN)
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.mark.parametrize("token", ["fg_a-minted-token-its-lookup-needs-the-database",
                                   ADMIN_TOKEN])
def test_requests_answer_503_database_unavailable_within_the_connect_bound(client, token):
    status, body, took = timed(client, "/models", token)
    assert (status, body["error"]["code"]) == (503, "database_unavailable"), body
    assert took < CONNECT_SECONDS + SLACK_SECONDS, took


def test_readyz_answers_within_a_second_naming_the_database(client):
    status, body, took = timed(client, "/readyz", "")
    assert status == 503 and body["checks"]["database"]["status"] == "failed", body
    assert body["checks"]["artifacts"]["status"] == "ok"
    assert took < CHECK_SECONDS + SLACK_SECONDS < CONNECT_SECONDS, took  # never the connect's
