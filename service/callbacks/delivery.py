"""What a callback POSTs (a final decision's status, shaped like a GitHub commit status) and
the one attempt to deliver it (worker.callbacks runs it as a task): to the address checked
just now, within a total deadline, its outcome recorded on the row (service.callbacks.queue)."""

import json
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from flipgate.signing import HEADER, signature
from service.callbacks.models import CallbackState
from service.callbacks.queue import queued_callback, record_attempt
from service.callbacks.targets import check_callback_url, full_callback_url
from service.config import Settings
from service.db import session_scope
from service.errors import InvalidInput
from service.gate.decisions import get_decision
from service.gate.models import Decision, Verdict
from service.gate.views import decision_view
from service.gate.webhook_secrets import signing_secret
from service.observability.context import HEADER as REQUEST_ID_HEADER
from service.observability.context import current_request_id, request_id_bound
from service.registry.models import ModelLine

logger = logging.getLogger(__name__)

STATES = {Verdict.APPROVE: "success", Verdict.BLOCK: "failure", Verdict.PENDING: "pending"}
DESCRIPTION_LENGTH = 140  # GitHub's limit


def callback_body(*, session: Session, decision: Decision) -> dict[str, Any]:
    """{state, description, target_url, context} of a final decision (GitHub's status API);
    without FLIPGATE_PUBLIC_URL the report's link is relative, and is left out."""
    view = decision_view(session=session, decision=decision)
    failed = any(reason["code"] == "measurement_failed" for reason in view.reasons)
    blocking = [reason["message"] for reason in view.reasons if reason["blocking"]]
    summary = (f"flipgate {view.verdict}s {view.model}:{view.candidate}"
               + ("" if view.baseline is None else f" over {view.baseline}")
               + (f": {blocking[0]}" if blocking else ""))
    body = {"state": "error" if failed else STATES[view.verdict],
            "description": summary[:DESCRIPTION_LENGTH], "context": f"flipgate/{view.model}"}
    if view.report_url and view.report_url.startswith(("https://", "http://")):
        body["target_url"] = view.report_url
    return body


def delivery(*, session: Session, settings: Settings,
             decision_id: int) -> tuple[str | None, dict[str, Any], str | None]:
    """The URL (None when no server key opens it), body and signing secret (the line's
    webhook secret, if any) of a callback."""
    decision = get_decision(session=session, decision_id=decision_id)
    line = session.get_one(ModelLine, decision.line_id)
    return (full_callback_url(settings, decision),
            callback_body(session=session, decision=decision),
            signing_secret(session=session, settings=settings, line_name=line.name))


def deliver(*, sessions: sessionmaker[Session], settings: Settings, decision_id: int) -> None:
    """POST the status once, if the callback is still queued; a failure is due again after a
    doubling delay (the worker's sweeper sends it) until the attempts allowed by
    FLIPGATE_CALLBACK_ATTEMPTS are spent."""
    with session_scope(sessions) as session:
        if queued_callback(session=session, decision_id=decision_id) is None:
            return
        url, body, secret = delivery(session=session, settings=settings,
                                     decision_id=decision_id)
        request_id = session.get_one(Decision, decision_id).request_id  # loaded: no query
    with request_id_bound(request_id):
        _attempt(sessions, settings, decision_id, url, json.dumps(body).encode(), secret)


def _attempt(sessions: sessionmaker[Session], settings: Settings, decision_id: int,
             url: str | None, body: bytes, secret: str | None) -> None:
    """One POST of the status, and its outcome recorded on the callback's row."""
    status, error = (post_status(settings, url, body, secret, decision_id)
                     if url is not None else (None, "callback_url_unreadable"))
    with session_scope(sessions) as session:
        callback = queued_callback(session=session, decision_id=decision_id)
        if callback is None:
            return
        record_attempt(callback=callback, status=status, error=error, settings=settings)
        if callback.state == CallbackState.QUEUED:
            logger.warning("callback of decision %s failed (%s); due again at %s",
                           decision_id, error or status, callback.due_at)


def post_status(settings: Settings, url: str, body: bytes, secret: str | None,
                decision_id: int) -> tuple[int | None, str | None]:
    """The HTTP status of one POST to the address checked just now (redirects are not
    followed), or None; the error is a fixed message, never the receiver's answer. The POST
    carries the request id under way (the gate request's) in X-Request-ID."""
    import httpx  # here, not at the top: its package loads rich, which the server never needs

    try:
        target = check_callback_url(url, settings.callback_allowlist)
    except InvalidInput as refused:
        return None, refused.code
    headers = {"Content-Type": "application/json", "X-Flipgate-Decision": str(decision_id),
               "Host": target.host_header}
    if (request_id := current_request_id()) is not None:  # the gate request's
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
