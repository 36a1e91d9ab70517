"""The callback task's POST (worker.callbacks.post_status) against a real HTTP server on
loopback: it goes only where the settings allow at delivery time, to the address it has
just checked, follows no redirect, is signed, never keeps the receiver's answer, and gives
up on a receiver that trickles its answer once the whole request's deadline has passed."""

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from flipgate.signing import HEADER, signature_matches
from service.callbacks.delivery import post_status
from service.celery_app import CALLBACK_TASK, ROUTES
from service.config import Settings
from worker.cli import queues_taken

BODY = b'{"state":"failure"}'
INTERNAL_PAGE = "root:x:0:0 internal page"


class Receiver(BaseHTTPRequestHandler):
    """200 on /ok, 500 with an internal page on /fail, a redirect to /ok on /moved."""

    seen: ClassVar[list[tuple[str, dict, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, dict(self.headers), body))
        status = {"/ok": 200, "/fail": 500, "/moved": 302}[self.path]
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/ok")
        self.end_headers()
        self.wfile.write(INTERNAL_PAGE.encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.seen = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def allowing(*entries: str) -> Settings:
    return Settings(callback_allowlist=list(entries), callback_timeout_seconds=5)


def test_an_allowlisted_receiver_gets_the_signed_status(receiver):
    port = receiver.split(":")[1]
    status, error = post_status(allowing("localhost"), f"http://localhost:{port}/ok", BODY,
                                "s3cret", 7)
    assert (status, error) == (200, None)
    path, headers, body = Receiver.seen[0]
    assert (path, body, headers["Host"]) == ("/ok", BODY, f"localhost:{port}")
    assert signature_matches("s3cret", body, headers[HEADER])


def test_delivery_checks_the_address_again_and_sends_nothing_when_refused(receiver):
    assert post_status(allowing(), f"http://{receiver}/ok", BODY, None, 7) == (
        None, "callback_url_refused")
    assert Receiver.seen == []


def test_the_receivers_answer_is_never_kept(receiver):
    status, error = post_status(allowing("127.0.0.0/8"), f"http://{receiver}/fail", BODY,
                                None, 7)
    assert status == 500 and INTERNAL_PAGE not in error and "500" in error


def test_redirects_are_not_followed(receiver):
    status, _error = post_status(allowing("127.0.0.1"), f"http://{receiver}/moved", BODY,
                                 None, 7)
    assert status == 302 and [path for path, *_ in Receiver.seen] == ["/moved"]


def test_an_unreachable_receiver_is_a_transport_error(receiver):
    closed = receiver.rsplit(":", 1)[0] + ":9"
    assert post_status(allowing("127.0.0.1"), f"http://{closed}/ok", BODY, None, 7) == (
        None, "transport error (ConnectError)")


def test_the_post_goes_to_the_address_just_checked_even_if_dns_then_answers_otherwise(
        receiver, monkeypatch):
    """DNS rebinding: the name resolves to the allowed receiver once, then elsewhere."""
    real_getaddrinfo, answers = socket.getaddrinfo, ["127.0.0.1", "192.0.2.1"]

    def rebinding(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        address = answers.pop(0) if len(answers) > 1 else answers[0]
        return real_getaddrinfo(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    port = receiver.split(":")[1]
    settings = Settings(callback_allowlist=["rebind.test"], callback_timeout_seconds=1)
    assert post_status(settings, f"http://rebind.test:{port}/ok", BODY, None, 7) == (200, None)
    path, headers, _body = Receiver.seen[0]
    assert (path, headers["Host"]) == ("/ok", f"rebind.test:{port}")


@pytest.fixture
def trickler() -> Iterator[tuple[str, threading.Event]]:
    """A receiver that answers its status line one byte every 0.2 s, for as long as the
    connection stays open (each read well within a per-read timeout); and an event set when
    the sender hung up."""
    listener = socket.create_server(("127.0.0.1", 0))
    hung_up = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        try:
            for byte in itertools.cycle(b"HTTP/1.1 200 OK\r\nX-Slow: "):
                connection.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            hung_up.set()
        finally:
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", hung_up
    listener.close()


@pytest.mark.serial  # bounds a time
def test_a_trickling_receiver_is_cut_off_at_the_deadline(trickler):
    address, hung_up = trickler
    settings = Settings(callback_allowlist=["127.0.0.1"], callback_timeout_seconds=1.5)
    started = time.monotonic()
    status, error = post_status(settings, f"http://{address}/ok", BODY, None, 7)
    took = time.monotonic() - started
    assert (status, error) == (None, "no answer within 1.5 s")
    assert 1.5 <= took < 3, took
    assert hung_up.wait(5)  # the connection is gone, not left to trickle on


def test_callbacks_have_a_queue_of_their_own_that_every_default_worker_takes():
    assert ROUTES[CALLBACK_TASK] == {"queue": "callbacks"}
    queues_routed = {route["queue"] for route in ROUTES.values()}
    assert set(queues_taken(None).split(",")) == queues_routed
    assert not any(route["queue"] == "callbacks" for task, route in ROUTES.items()
                   if task != CALLBACK_TASK)  # no measurement waits behind a receiver
