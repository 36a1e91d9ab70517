"""The embedded broker: kombu's filesystem transport, with each message written atomically.

kombu writes a message file in place, under its final name, so a worker polling the folder
can move it away and read it while it is still empty; the worker then stops with
"Unrecoverable error: JSONDecodeError". Here a message is written under a hidden name that
no consumer takes (a name that starts with a dot), then renamed to its final name."""

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

SHUTDOWN_CHECK_SECONDS = 0.25


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put `payload` on `queue`: written to a hidden file, then renamed into place."""
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        hidden = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(hidden, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(hidden, final)
        except OSError as error:
            raise ChannelError(f"Cannot add file {final!r} to directory") from error


class Transport(filesystem.Transport):
    Channel = Channel

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """kombu's wait for a message, for at most SHUTDOWN_CHECK_SECONDS at a time: Celery's
        worker loop waits 2 s per call and looks for a shutdown between calls, so a SIGTERM
        waited up to 2 s before the worker began to stop."""
        capped = timeout if timeout is None else min(timeout, SHUTDOWN_CHECK_SECONDS)
        super().drain_events(connection, timeout=capped)
