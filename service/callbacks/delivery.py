"""The one attempt to deliver a callback (worker.callbacks runs it as a task): its status
(what the gate's `statuses` composes from a final decision) POSTed to the address checked
just now, within a total deadline, its outcome recorded on the row
(service.callbacks.scheduling)."""

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from flipgate.signing import HEADER, signature
from service.callbacks.models import CallbackState
from service.callbacks.scheduling import queued_callback, record_attempt
from service.callbacks.targets import check_callback_url
from service.config import Settings
from service.db import session_scope
from service.errors import InvalidInput
from service.observability.context import HEADER as REQUEST_ID_HEADER

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    """What one callback POSTs: where (None when no server key opens the URL), the body, the
    secret that signs it (if any), and the id of the request that asked for the decision."""

    decision_id: int
    url: str | None
    body: bytes
    secret: str | None
    request_id: str | None


def attempt(*, sessions: sessionmaker[Session], settings: Settings, status: Status) -> None:
    """One POST of the status, and its outcome recorded on the callback's row (a failure is
    due again after a doubling delay, and the worker's sweeper sends it, until the attempts
    allowed by FLIPGATE_CALLBACK_ATTEMPTS are spent)."""
    answer, error = (post_status(settings, status.url, status.body, status.secret,
                                 status.decision_id, request_id=status.request_id)
                     if status.url is not None else (None, "callback_url_unreadable"))
    with session_scope(sessions) as session:
        callback = queued_callback(session=session, decision_id=status.decision_id)
        if callback is None:
            return
        record_attempt(callback=callback, status=answer, error=error, settings=settings)
        if callback.state == CallbackState.QUEUED:
            logger.warning("callback of decision %s failed (%s); due again at %s",
                           status.decision_id, error or answer, callback.due_at)


def post_status(settings: Settings, url: str, body: bytes, secret: str | None, decision_id: int,
                *, request_id: str | None = None) -> tuple[int | None, str | None]:
    """The HTTP status of one POST to the address checked just now (redirects are not
    followed), or None; the error is a fixed message, never the receiver's answer. The POST
    carries the gate request's id, if any, in X-Request-ID."""
    import httpx  # here, not at the top: its package loads rich, which the server never needs

    try:
        target = check_callback_url(url, settings.callback_allowlist)
    except InvalidInput as refused:
        return None, refused.code
    headers = {"Content-Type": "application/json", "X-Flipgate-Decision": str(decision_id),
               "Host": target.host_header}
    if request_id is not None:
        headers[REQUEST_ID_HEADER] = request_id
    if secret is not None:
        headers[HEADER] = signature(secret, body)
    deadline = settings.callback_timeout_seconds
    with cut_after(deadline) as cut:
        try:
            with (httpx.Client(timeout=deadline, follow_redirects=False) as client,
                  client.stream("POST", target.url, content=body, headers=headers, extensions={
                      "sni_hostname": target.host, "trace": cut.watch}) as response):
                status = response.status_code  # the body is never read
        except httpx.HTTPError as error:
            return None, (f"no answer within {deadline:g} s" if cut.fired.is_set()
                          else f"transport error ({type(error).__name__})")
    return status, None if 200 <= status < 300 else (
        f"HTTP {status}: the receiver did not accept the status")


class Deadline:
    """Shuts down the sockets a request opens once its time is up (httpx's timeouts bound
    each read, not the whole request: a receiver that trickles a byte at a time would hold
    the worker for as long as it liked)."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.fired = threading.Event()
        self.lock = threading.Lock()

    def watch(self, event: str, info: dict) -> None:
        """httpcore's trace hook: keep each connection's socket."""
        if event == "connection.connect_tcp.complete" and info.get("return_value"):
            with self.lock:
                self.sockets.append(info["return_value"].get_extra_info("socket"))
                if self.fired.is_set():
                    self._shut(self.sockets[-1])

    def fire(self) -> None:
        with self.lock:
            self.fired.set()
            for connection in self.sockets:
                self._shut(connection)

    @staticmethod
    def _shut(connection: socket.socket) -> None:
        with suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)


@contextmanager
def cut_after(seconds: float) -> Iterator[Deadline]:
    """A Deadline that fires `seconds` from now unless the block has ended."""
    deadline = Deadline()
    timer = threading.Timer(seconds, deadline.fire)
    timer.daemon = True
    timer.start()
    try:
        yield deadline
    finally:
        timer.cancel()
