"""A real `flipgate serve --api-only` is not held by slow or unauthenticated clients:
requests without credentials never take an admission slot, a body that trickles in is cut
off with 408 (its slot set free), and a stale signature is refused before the body is read."""

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from flipgate.signing import HEADER, signature
from service.main import ADMITTED_REQUESTS
from tests.load.conftest import AUTHORIZED, Server, read_response, serving

pytestmark = [pytest.mark.slow, pytest.mark.serial]
GRACE_SECONDS = 1.0  # the server's body grace in these tests
ANSWER_WITHIN_SECONDS = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("slow"), "--api-only",
                 FLIPGATE_BODY_GRACE_SECONDS=str(GRACE_SECONDS)) as running:
        yield running


def trickling_post(server: Server, path: str, headers: dict[str, str],
                   declared: int = 100) -> socket.socket:
    """A POST that declares `declared` bytes of JSON and sends one; its connection."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {declared}",
            "Content-Type: application/json",
            *(f"{name}: {value}" for name, value in headers.items())]
    connection = socket.create_connection(("127.0.0.1", server.port))
    connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"{")
    return connection


def timed_get(server: Server) -> tuple[int, float]:
    started = time.monotonic()
    response = httpx.get(f"{server.url}/models", headers=AUTHORIZED, timeout=10)
    return response.status_code, time.monotonic() - started


def test_many_slow_unauthenticated_bodies_leave_every_slot_free(server: Server):
    with ExitStack() as clients:
        answers = [read_response(clients.enter_context(trickling_post(server, "/gate", {})), 5)
                   for _ in range(10 * ADMITTED_REQUESTS)]
        status, seconds = timed_get(server)
    assert {answer.status for answer in answers} == {401}
    assert status == 200
    assert seconds < ANSWER_WITHIN_SECONDS, seconds


def test_a_trickling_authenticated_body_gets_408_and_frees_its_slot(server: Server):
    with ExitStack() as clients:
        connections = [clients.enter_context(trickling_post(server, "/gate", AUTHORIZED))
                       for _ in range(ADMITTED_REQUESTS)]
        assert timed_get(server)[0] == 503  # every slot is held, for now
        started = time.monotonic()
        answers = [read_response(connection, 10 * GRACE_SECONDS)
                   for connection in connections]
        cut_off_after = time.monotonic() - started
        status, _seconds = timed_get(server)
    assert {answer.status for answer in answers} == {408}
    assert b"body_too_slow" in answers[0].read()
    assert cut_off_after < GRACE_SECONDS + ANSWER_WITHIN_SECONDS, cut_off_after
    assert status == 200
    print(f"\nslow bodies cut off with 408 {cut_off_after * 1000:.0f} ms after the last "
          f"was sent (grace {GRACE_SECONDS:g} s)")


def test_a_stale_signature_is_refused_before_the_body_is_read(server: Server):
    stale = signature("any-secret", b"{", timestamp=int(time.time()) - 3600)
    connection = trickling_post(server, "/gate", {HEADER: stale}, declared=64 * 2**20)
    with connection:
        answer = read_response(connection, ANSWER_WITHIN_SECONDS)
        assert answer.status == 401
        assert b"stale_signature" in answer.read()


def test_the_sign_in_form_is_capped_at_a_few_kilobytes(server: Server):
    response = httpx.post(f"{server.url}/ui/signin", data={"token": "x" * 10_000})
    assert response.status_code == 413  # a page for the person, as every error under /ui
    assert response.headers["content-type"].startswith("text/html")
