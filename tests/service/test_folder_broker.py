"""The embedded broker (service.folder_broker) under a consumer that polls while another
process writes messages: kombu's own filesystem transport lets the consumer take a message
file before all its bytes are in, and the worker then stops on a JSONDecodeError."""

import socket
import subprocess
import sys
import time
from queue import Empty

import pytest

from service.celery_app import create_celery_app
from service.config import Settings
from service.folder_broker import SHUTDOWN_CHECK_SECONDS

MESSAGES, BODY_BYTES = 300, 256 * 1024
SENDER = """
import sys
from pathlib import Path
from service.config import Settings
from service.celery_app import create_celery_app
celery = create_celery_app(Settings(data_dir=Path(sys.argv[1])))
with celery.connection_for_write() as connection:
    for number in range(int(sys.argv[2])):
        connection.default_channel._put("default", {"n": number, "body": "x" * int(sys.argv[3])})
"""


def test_a_consumer_polling_while_messages_are_written_reads_each_whole_once(tmp_path):
    celery = create_celery_app(Settings(data_dir=tmp_path))
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(tmp_path), str(MESSAGES),
                               str(BODY_BYTES)])
    received, deadline = [], time.monotonic() + 120
    with celery.connection_for_write() as reader:
        while len(received) < MESSAGES and time.monotonic() < deadline:
            try:
                received.append(reader.default_channel._get("default")["n"])
            except Empty:
                continue
    assert sender.wait(60) == 0
    assert sorted(received) == list(range(MESSAGES))


@pytest.mark.serial  # bounds a time
def test_a_wait_for_messages_returns_in_time_to_notice_a_shutdown(tmp_path):
    """Celery's worker loop asks the transport to wait 2 s and looks for a SIGTERM between
    waits; the folder broker returns after SHUTDOWN_CHECK_SECONDS, so a worker starts to
    stop that soon (and a short `timeout` is still honoured)."""
    celery = create_celery_app(Settings(data_dir=tmp_path))
    with celery.connection_for_write() as connection:
        connection.default_channel.basic_consume("default", True, lambda *_: None, "test")
        assert SHUTDOWN_CHECK_SECONDS <= waited_for_nothing(connection, 2.0) < 1.0
        assert 0.05 <= waited_for_nothing(connection, 0.05) < SHUTDOWN_CHECK_SECONDS


def waited_for_nothing(connection, timeout: float) -> float:
    """Seconds `drain_events(timeout)` took on an empty queue to raise socket.timeout."""
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        connection.drain_events(timeout=timeout)
    return time.monotonic() - started
