"""A real `flipgate serve --api-only` refuses at once what it will not serve: with every
admission slot held by an upload that stops streaming, other requests answer 503
`server_busy` within a second (and are served again once those uploads go away); a body
declared at 300 MB without credentials answers 401 before it is sent, and nothing of it
reaches the disk."""

import json
import select
import socket
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from service.main import ADMITTED_REQUESTS
from service.storage import open_store
from tests.e2e.conftest import wait_for
from tests.load.conftest import AUTHORIZED, Server, partial_upload, read_response

pytestmark = [pytest.mark.slow, pytest.mark.serial]
BUSY_WITHIN_SECONDS = 1.0
STALLED_BYTES = 10 * 2**20  # each stalled upload declares this much and sends 64 KiB
UNREAD_BYTES = 300 * 2**20


def timed_get(client: httpx.Client, path: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = client.get(path)
    return response, time.monotonic() - started


def test_requests_beyond_the_admitted_ones_answer_503_at_once(api_server: Server):
    with httpx.Client(base_url=api_server.url, headers=AUTHORIZED, timeout=10) as client:
        with ExitStack() as stalled:
            hold_every_slot(api_server, stalled, client)
            refusals = [timed_get(client, "/models") for _ in range(5)]
            probes = [client.get("/healthz"), client.get("/readyz")]
        gone_at = time.monotonic()
        served_again = wait_for(lambda: _served(client), "a slot set free", 10)
        recovered_in = time.monotonic() - gone_at
    for response, seconds_taken in refusals:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "server_busy"
        assert response.headers["retry-after"] == "1"
        assert seconds_taken < BUSY_WITHIN_SECONDS, seconds_taken
    print(f"\n503 server_busy in {max(seconds for _, seconds in refusals) * 1000:.0f} ms at "
          f"most; served again {recovered_in * 1000:.0f} ms after the stalled uploads went away")
    assert [probe.status_code for probe in probes] == [200, 200], probes[1].text
    assert probes[1].json()["status"] == "ready"
    assert served_again.status_code == 200


def hold_every_slot(server: Server, stalled: ExitStack, client: httpx.Client) -> None:
    """Stalled uploads in every admission slot, checked by a GET answered 503. The server
    may take the uploads' connections in any order, so a probe can get a slot first and an
    upload the 503: an upload answered so is sent again until the probe is the one refused."""
    uploads = [stalled.enter_context(stalled_upload(server)) for _ in range(ADMITTED_REQUESTS)]
    seen: list[int] = []

    def every_slot_taken() -> bool:
        for index, upload in enumerate(uploads):
            if select.select([upload], [], [], 0)[0]:  # answered (503): it holds no slot
                uploads[index] = stalled.enter_context(stalled_upload(server))
        seen.append(client.get("/models").status_code)
        return seen[-1] == 503

    try:
        wait_for(every_slot_taken, "every slot taken", 10)
    except AssertionError as error:
        raise AssertionError(f"{error}: GET /models answered {seen}") from error


def stalled_upload(server: Server) -> socket.socket:
    return partial_upload(server, declared=STALLED_BYTES, headers=AUTHORIZED)


def _served(client: httpx.Client) -> httpx.Response | None:
    response = client.get("/models")
    return response if response.status_code == 200 else None


def test_a_300_mb_body_without_credentials_is_refused_unread(api_server: Server):
    temporary_files = files_under(api_server.tmp_dir)  # a library's, written at start-up
    started = time.monotonic()
    with partial_upload(api_server, declared=UNREAD_BYTES, headers={}) as connection:
        response = read_response(connection, timeout=10)
        answered_in = time.monotonic() - started
        body = json.loads(response.read())
        refused_after = _bytes_sent_until_refused(connection)
    print(f"\n401 after {answered_in * 1000:.0f} ms with 64 KiB of 300 MiB sent; the rest "
          f"was refused after {refused_after / 2**20:.1f} MiB more")
    assert response.status == 401
    assert body["error"]["code"] == "missing_credentials"
    assert response.getheader("connection") == "close"
    assert answered_in < BUSY_WITHIN_SECONDS
    assert refused_after < UNREAD_BYTES // 10
    assert list(open_store(api_server.settings).partial_files()) == []
    assert files_under(api_server.tmp_dir) == temporary_files


def files_under(folder: Path) -> dict[str, int]:
    """The size of each file under a folder (none when it does not exist)."""
    return {str(path): path.stat().st_size for path in folder.rglob("*") if path.is_file()}


def _bytes_sent_until_refused(connection) -> int:
    """How many bytes more of the body a closed connection took before it refused them."""
    chunk, sent = b"\0" * 2**20, 0
    connection.settimeout(5)
    try:
        while sent < UNREAD_BYTES:
            sent += connection.send(chunk)
    except OSError:
        return sent
    return sent
