"""PostgreSQL frozen in the middle of a session: requests that hold pooled connections are
answered 503 `database_unavailable` within the documented bound, /readyz within a second,
and once the database answers again every request succeeds with nothing stored lost.

"Frozen" is a relay in front of the shared PostgreSQL that stops passing bytes without
closing anything: what a client sees of a server stopped with SIGSTOP (its kernel still
accepts connections and takes the bytes; nothing comes back) or of a network path that goes
quiet. Never SIGSTOP the shared server itself."""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from service.auth.service import create_token
from service.config import Settings
from service.db import CONNECT_SECONDS, POOL_OVERFLOW, POOL_SIZE, settings_session
from service.db_watchdog import TICK_SECONDS
from service.health import CHECK_SECONDS
from service.main import ADMITTED_REQUESTS, create_app
from service.migrate import upgrade
from tests.service.api.conftest import ADMIN_TOKEN, bearer, timed
from tests.service.conftest import postgres_schema, write_onnx

pytestmark = pytest.mark.serial  # bounds how long a request waits

ROUND_TRIP_SECONDS = 1.0  # FLIPGATE_DB_STATEMENT_SECONDS in these tests
# a pooled connection's ping is cut, then the pool's new connection times out
REQUEST_BOUND = ROUND_TRIP_SECONDS + TICK_SECONDS + CONNECT_SECONDS
SLACK_SECONDS = 1.5  # a loaded test machine's scheduling
MOST_FROZEN_SECONDS = 30  # the relay thaws by itself then


class FreezingRelay:
    """A TCP relay to `upstream` whose freeze() holds every byte, in both directions, until
    thaw(); connections stay open and new ones are accepted meanwhile."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.flowing = threading.Event()
        self.flowing.set()
        self.thaw_timer: threading.Timer | None = None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        """Hold every byte until thaw(), or MOST_FROZEN_SECONDS: a client with no bound of
        its own then gets a late answer and fails the test instead of hanging it."""
        self.flowing.clear()
        self.thaw_timer = threading.Timer(MOST_FROZEN_SECONDS, self.thaw)
        self.thaw_timer.start()

    def thaw(self) -> None:
        self.flowing.set()
        if self.thaw_timer is not None:
            self.thaw_timer.cancel()

    def close(self) -> None:
        self.thaw()
        self.listener.close()
        for end in self.sockets:
            _shut(end)
            end.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # the relay was closed
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pass, args=(source, target), daemon=True).start()

    def _pass(self, source: socket.socket, target: socket.socket) -> None:
        """Copy source to target, each chunk once the relay flows; when either ends, end both."""
        try:
            while chunk := source.recv(65536):
                self.flowing.wait()
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            _shut(source)
            _shut(target)


def _shut(end: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already shut by the other direction or the peer
        end.shutdown(socket.SHUT_RDWR)


@dataclass
class FrozenSetup:
    """An API on PostgreSQL through a relay, a minted token with read and write scopes."""

    client: TestClient
    relay: FreezingRelay
    token: str


@pytest.fixture
def frozen_setup(tmp_path) -> Iterator[FrozenSetup]:
    with postgres_schema() as direct_url:
        direct = Settings(database_url=direct_url, data_dir=tmp_path / "data",
                          admin_token=ADMIN_TOKEN)
        upgrade(direct)
        with settings_session(direct) as session:
            _, token = create_token(session=session, name="ci", scopes=["read", "write"])
        url = make_url(direct_url)
        relay = FreezingRelay((url.host, url.port))
        relayed = direct.model_copy(update={
            "database_url": url.set(port=relay.port).render_as_string(hide_password=False),
            "db_statement_seconds": ROUND_TRIP_SECONDS})
        try:  # one event loop serves every request, as in `flipgate serve`
            with TestClient(create_app(relayed), raise_server_exceptions=False) as client:
                yield FrozenSetup(client, relay, token)
        finally:
            relay.close()


def test_requests_on_a_frozen_database_are_answered_503_within_the_bound_then_recover(
        frozen_setup, tmp_path):
    client, relay, token = frozen_setup.client, frozen_setup.relay, frozen_setup.token
    model = write_onnx(tmp_path).read_bytes()
    stored = client.post("/models", headers=bearer(token), data={"name": "digits",
                         "version": "1.0"}, files={"artifact": ("model.onnx", model)})
    assert stored.status_code == 201, stored.text
    assert client.get("/models", headers=bearer(token)).status_code == 200  # pooled, alive

    relay.freeze()
    for presented in (token, ADMIN_TOKEN):  # the token's lookup, then the endpoint's session
        status, body, took = timed(client, "/models", presented)
        assert status == 503 and body["error"]["code"] == "database_unavailable", body
        assert took < REQUEST_BOUND + SLACK_SECONDS, took
    status, body, took = timed(client, "/readyz", "")
    assert status == 503 and body["checks"]["database"]["status"] == "failed", body
    assert took < CHECK_SECONDS + SLACK_SECONDS, took

    relay.thaw()
    for _ in range(POOL_SIZE + POOL_OVERFLOW + 1):  # more than the pool holds: none stuck
        listed = client.get("/models", headers=bearer(token))
        assert listed.status_code == 200, listed.text
        assert [line["name"] for line in listed.json()] == ["digits"]
    assert client.get("/readyz").status_code == 200
    assert client.app.state.engine.pool.checkedout() == 0


def test_a_commit_frozen_mid_transaction_fails_within_the_bound(frozen_setup):
    engine, relay = frozen_setup.client.app.state.engine, frozen_setup.relay
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))  # a transaction is open on a live connection
        relay.freeze()
        started = time.monotonic()
        with pytest.raises(OperationalError):
            connection.commit()
        took = time.monotonic() - started
    assert ROUND_TRIP_SECONDS <= took < ROUND_TRIP_SECONDS + TICK_SECONDS + SLACK_SECONDS
    relay.thaw()
    with engine.connect() as connection:
        assert connection.execute(text("SELECT 1")).scalar() == 1


def test_requests_waiting_on_a_frozen_database_hold_up_no_other_request(frozen_setup):
    client, relay, token = frozen_setup.client, frozen_setup.relay, frozen_setup.token
    assert client.get("/models", headers=bearer(token)).status_code == 200
    relay.freeze()
    with ThreadPoolExecutor(2 * ADMITTED_REQUESTS) as pool:
        # the admin's request waits in its session's check-out; the minted tokens' wait in
        # their lookups in the slots left, and the rest find no slot free
        waiting = [pool.submit(timed, client, "/models", ADMIN_TOKEN)]
        time.sleep(0.3)
        waiting += [pool.submit(timed, client, "/models", token)
                    for _ in range(2 * ADMITTED_REQUESTS - 1)]
        time.sleep(0.3)
        for probe in ("/healthz", "/readyz"):
            _, _, took = timed(client, probe, "")
            assert took < CHECK_SECONDS + 0.5, (probe, took)
        answers = [request.result() for request in waiting]
    assert {status for status, _, _ in answers} == {503}, answers
    codes = [body["error"]["code"] for _, body, _ in answers]
    assert codes.count("server_busy") == ADMITTED_REQUESTS, codes
    busy = [took for _, body, took in answers if body["error"]["code"] == "server_busy"]
    assert max(busy) < SLACK_SECONDS, answers  # refused before any lookup, not after one
    assert set(codes) == {"database_unavailable", "server_busy"}, codes
    slowest = max(took for _, _, took in answers)
    assert slowest < REQUEST_BOUND + SLACK_SECONDS, answers
    relay.thaw()
    assert client.get("/models", headers=bearer(token)).status_code == 200
