"""The embedded broker (service.folder_broker) under a consumer that polls while another
process writes messages: kombu's own filesystem transport lets the consumer take a message
file before all its bytes are in, and the worker then stops on a JSONDecodeError."""

import subprocess
import sys
import time
from queue import Empty

from service.config import Settings
from service.queue import create_celery_app

MESSAGES, BODY_BYTES = 300, 256 * 1024
SENDER = """
import sys
from pathlib import Path
from service.config import Settings
from service.queue import create_celery_app
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
