"""A bound on every round trip to PostgreSQL (a statement, a commit or rollback, the pool's
check-out ping).

A server that stops answering in the middle of a session (SIGSTOP, or a network path that
stops passing bytes) leaves the client waiting for ever: a stopped server's kernel still
acknowledges every byte, so no TCP timeout fires, and neither libpq nor a server-side
`statement_timeout` can end a wait on a server that runs nothing. Only the client can: the
connections made here register each wait with a watchdog thread, which shuts down the socket
of one that runs past its bound. The driver then fails at once with OperationalError,
SQLAlchemy discards the connection (its pool opens a new one when the server is back), and
the API answers 503 `database_unavailable`."""

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any

import psycopg

TICK_SECONDS = 0.1  # how often the watchdog looks; a wait is cut at most this late
logger = logging.getLogger(__name__)


class Watchdog:
    """Deadlines of the waits in progress, and the thread that cuts those past theirs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[float, psycopg.Connection]] = {}
        self._thread: threading.Thread | None = None

    def arm(self, connection: psycopg.Connection, seconds: float) -> None:
        """Cut `connection` unless disarm() comes within `seconds`."""
        with self._lock:
            self._waits[id(connection)] = (time.monotonic() + seconds, connection)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="db-watchdog",
                                                daemon=True)
                self._thread.start()

    def disarm(self, connection: psycopg.Connection) -> None:
        with self._lock:
            self._waits.pop(id(connection), None)

    def _watch(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)
            now = time.monotonic()
            with self._lock:  # a wait disarmed before this point is never cut
                overdue = [key for key, (deadline, _) in self._waits.items() if deadline <= now]
                for key in overdue:
                    _cut(self._waits.pop(key)[1])


def _cut(connection: psycopg.Connection) -> None:
    """Shut down the connection's socket (both ways) so the driver's wait ends in an error;
    the connection's own file descriptor stays the driver's to close."""
    if connection.closed:
        return
    logger.warning("PostgreSQL did not answer within the round-trip bound "
                   "(FLIPGATE_DB_STATEMENT_SECONDS); closing the connection")
    # already shut down or reset by the peer: the wait ends anyway
    with contextlib.suppress(OSError), socket.socket(
            fileno=os.dup(connection.fileno())) as duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()


class BoundedConnection(psycopg.Connection):
    """A psycopg connection whose every wait on the server (psycopg routes each statement,
    commit, rollback and fetch through `wait`) is cut after `round_trip_seconds`."""

    round_trip_seconds: float

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        WATCHDOG.arm(self, self.round_trip_seconds)
        try:
            return super().wait(*args, **kwargs)
        finally:
            WATCHDOG.disarm(self)


def bounded_connector(seconds: float) -> Any:
    """A `do_connect` listener for a PostgreSQL engine: its connections are BoundedConnections
    cut after `seconds` (connecting itself is bounded by libpq's connect_timeout)."""

    def connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> BoundedConnection:
        connection = BoundedConnection.connect(*cargs, **cparams)
        connection.round_trip_seconds = seconds
        return connection

    return connect
