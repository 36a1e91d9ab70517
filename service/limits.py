"""Limits on requests: the size of their bodies and how long they may take to arrive,
enforced while they are read, and how many are served at once (admission), with their
credentials checked before any body is read (a bearer token in the slot it takes)."""

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.datastructures import Headers, State
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flipgate.signing import HEADER as SIGNATURE_HEADER
from flipgate.signing import SignatureError, fresh_header
from service import urls
from service.audit.requests import record_token_refusal
from service.auth.service import TokenRefused
from service.config import Settings
from service.errors import Unauthorized, database_refusal, error_response
from service.ui.session import COOKIE, is_signed_session


class RequestBodyLimit:
    """ASGI middleware that bounds every request body while it is read (BodyBudget): 413
    past `max_bytes` (DASHBOARD_FORM_BYTES under /ui), 408 when it arrives too slowly.

    The exceptions are raised inside the endpoint's body parsing, so the app's own handler
    renders them (FastAPI's max_body_size would answer in plain text instead).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, settings: Settings) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        dashboard = scope["path"].startswith(COOKIE_SIGNED_PREFIX)
        budget = BodyBudget(receive, Headers(scope=scope), self.settings,
                            max_bytes=DASHBOARD_FORM_BYTES if dashboard else self.max_bytes)
        await self.app(scope, budget.receive, send)


class BodyBudget:
    """The receive of one request whose body must stay within `max_bytes` and arrive within
    the settings' grace plus one second per `body_min_rate` bytes received (a minimum rate),
    and within `body_deadline_seconds` in all; the clock starts when the app is called."""

    def __init__(self, receive: Receive, headers: Headers, settings: Settings, *,
                 max_bytes: int) -> None:
        declared = headers.get("content-length", "")
        self.declared = int(declared) if declared.isdecimal() else 0
        self.upstream, self.settings, self.max_bytes = receive, settings, max_bytes
        self.started, self.received, self.complete = time.monotonic(), 0, False

    async def receive(self) -> Message:
        if self.complete:  # after the body, only a disconnect is waited for
            return await self.upstream()
        with anyio.move_on_after(self.seconds_left()) as waiting:
            message = await self.upstream()
        if waiting.cancelled_caught:
            raise HTTPException(408, "the request body arrived too slowly (at least "
                                f"{self.settings.body_min_rate} bytes per second after "
                                f"{self.settings.body_grace_seconds:g} s, all within "
                                f"{self.settings.body_deadline_seconds:g} s)", CLOSE)
        self.received += len(message.get("body", b""))
        self.complete = not message.get("more_body", False)
        if max(self.declared, self.received) > self.max_bytes:
            raise HTTPException(413, f"the request body is larger than the limit of "
                                     f"{self.max_bytes} bytes")
        return message

    def seconds_left(self) -> float:
        """How long the next part of the body may take to arrive."""
        settings = self.settings
        allowed = min(settings.body_deadline_seconds,
                      settings.body_grace_seconds + self.received / settings.body_min_rate)
        return allowed - (time.monotonic() - self.started)


class Admission:
    """ASGI middleware in front of every database-backed request.

    - Credentials are checked from the headers before anything reads the body: a bearer
      token (on its own short read-only session; a revoked or expired one is written to the
      audit trail, an unknown one only counted), the signature headers of a SIGNED_ROUTES
      webhook (the gate's must parse, with its timestamp in the window; the endpoint checks
      digests), or on /ui a well-signed session cookie. Bad credentials, and a body sent
      without any (except the dashboard's small forms), are refused with 401 unread. The
      checked token waits in `request.state.token` for the route's scope check.
    - Only requests with credentials take a slot: at most `slots` are served at once (fewer
      than the database pool's connections and the thread pool's threads, so an admitted
      request never waits for either); beyond that the answer is 503 `server_busy` with
      Retry-After at once. A bearer token is looked up in its slot: when none is free the
      request is refused before any database work, so a refusal costs no more than its
      answer. Requests without credentials carry no body, or a dashboard form of at most
      DASHBOARD_FORM_BYTES, and are served outside the slots (their endpoints refuse them,
      or serve a public page).
    - The probes (/healthz, /readyz) skip all of it, so they answer under any load; a
      scrape of /metrics has its token checked but takes no slot (UNSLOTTED): its lookups
      run at most TOKEN_LOOKUPS at once, and one that waits LOOKUP_WAIT_SECONDS for its turn
      (behind lookups that a database which stopped answering holds) is answered 503
      `server_busy`.
    - The slots are per process: `flipgate serve --workers N` serves up to N × `slots`.
    """

    def __init__(self, app: ASGIApp, *, slots: int, authenticate: Callable[[str], object],
                 state: State) -> None:
        self.app = app
        self.free = slots
        self.authenticate = authenticate
        self.state = state
        self.lookups = anyio.CapacityLimiter(TOKEN_LOOKUPS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBES:
            await self.app(scope, receive, send)
            return
        presented = bearer_token(scope)
        try:
            credentialed = presented is not None or self.check_credentials(scope)
        except Unauthorized as error:
            await refused(error)(scope, receive, send)
            return
        if not credentialed:
            await self.app(scope, receive, send)
        elif scope["path"] in UNSLOTTED:
            await self.serve_unslotted(presented, scope, receive, send)
        else:
            await self.serve_in_slot(presented, scope, receive, send)

    async def serve_in_slot(self, presented: str | None, scope: Scope, receive: Receive,
                            send: Send) -> None:
        """Serve a credentialed request in a slot (its bearer token looked up there), or
        refuse it at once when none is free."""
        if self.free == 0:  # one event loop: no await between this check and the claim
            await BUSY(scope, receive, send)
            return
        self.free -= 1
        try:
            if presented is None or await self.admits(presented, scope, receive, send):
                await self.app(scope, receive, send)
        finally:
            self.free += 1

    async def serve_unslotted(self, presented: str | None, scope: Scope, receive: Receive,
                              send: Send) -> None:
        """Serve an UNSLOTTED request, its bearer token looked up at most TOKEN_LOOKUPS at
        once (503 `server_busy` when no turn comes within LOOKUP_WAIT_SECONDS)."""
        if presented is not None:
            with anyio.move_on_after(LOOKUP_WAIT_SECONDS) as waiting:
                await self.lookups.acquire()
            if waiting.cancelled_caught:
                await BUSY(scope, receive, send)
                return
            try:
                admitted = await self.admits(presented, scope, receive, send)
            finally:
                self.lookups.release()
            if not admitted:
                return
        await self.app(scope, receive, send)

    async def admits(self, presented: str, scope: Scope, receive: Receive, send: Send) -> bool:
        """Whether the presented token is live (it is stored in the scope); else the refusal
        is answered: 401 (a revoked or expired token written to the audit trail first), or
        503 when the database cannot look it up."""
        try:
            token = await anyio.to_thread.run_sync(self.authenticate, presented)
        except TokenRefused as error:
            await anyio.to_thread.run_sync(record_token_refusal, self.state.sessions, scope,
                                           error)
            await refused(error)(scope, receive, send)
            return False
        except Unauthorized as error:
            await refused(error)(scope, receive, send)
            return False
        except (OperationalError, PoolTimeout) as error:  # the token's lookup: 503, not 500
            refusal = database_refusal(error)
            refusal.headers["Connection"] = "close"  # the body, if any, was not read
            await refusal(scope, receive, send)
            return False
        scope.setdefault("state", {})["token"] = token
        return True

    def check_credentials(self, scope: Scope) -> bool:
        """Whether a request without a bearer token carries other valid credentials;
        Unauthorized for bad ones, or for a body sent without any."""
        headers, path = Headers(scope=scope), scope["path"]
        signed = SIGNED_ROUTES.get(path)
        if signed is not None and all(name in headers for name in signed.headers):
            if SIGNATURE_HEADER in signed.headers:
                self.check_signature_time(headers[SIGNATURE_HEADER])
            return True
        if path.startswith(COOKIE_SIGNED_PREFIX):
            cookie = HTTPConnection(scope).cookies.get(COOKIE)
            return is_signed_session(self.state.settings, cookie)
        if _has_body(headers):
            refusal = signed or UNSIGNED
            raise Unauthorized(refusal.missing_code, f"{refusal.hint}; the body was not read")
        return False

    def check_signature_time(self, header: str) -> None:
        """Unauthorized unless the signature header parses and is within the window."""
        tolerance = self.state.settings.signature_tolerance_seconds
        try:
            fresh_header(header, tolerance_seconds=tolerance)
        except SignatureError as error:
            raise Unauthorized(error.code, f"{error.message}; the body was not read") from error


def bearer_token(scope: Scope) -> str | None:
    """The token of the request's `Authorization: Bearer` header, if it sends one."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, presented = value.decode("latin-1").partition(" ")
            return presented.strip() or None if scheme.lower() == "bearer" else None
    return None


def refused(error: Unauthorized) -> Response:
    """The 401 of bad credentials, answered before the body was read."""
    return error_response(401, error.code, error.message, UNREAD_BODY_CHALLENGE)


def _has_body(headers: Headers) -> bool:
    """Whether a request declares a body (a non-zero or unparsable length, or chunks)."""
    declared = headers.get("content-length")
    if declared is None:
        return "transfer-encoding" in headers
    return not declared.strip().isdecimal() or int(declared) > 0


PROBES = frozenset({urls.healthz(), urls.readyz()})
# checked like any request, but served outside the slots: a scrape under load still answers
UNSLOTTED = frozenset({urls.metrics()})


@dataclass(frozen=True)
class SignedRoute:
    """A route that takes a signature of its body instead of a token: the headers that must
    all be sent (the endpoint checks the digest), and the refusal when one is missing."""

    headers: tuple[str, ...]
    missing_code: str
    hint: str


TOKEN_HINT = "send 'Authorization: Bearer <token>'"
UNSIGNED = SignedRoute((), "missing_credentials", TOKEN_HINT)
SIGNED_ROUTES = {
    urls.gate(): SignedRoute((SIGNATURE_HEADER,), "missing_credentials",
                         f"{TOKEN_HINT} or a '{SIGNATURE_HEADER}' signature"),
    # the MLflow connector's webhook (service.integrations.mlflow)
    urls.mlflow_webhook(): SignedRoute(
        MLFLOW_HEADERS := ("X-MLflow-Delivery-Id", "X-MLflow-Timestamp", "X-MLflow-Signature"),
        "missing_signature", f"send {', '.join(MLFLOW_HEADERS)}"),
}
COOKIE_SIGNED_PREFIX = urls.UI
DASHBOARD_FORM_BYTES = 4096  # the sign-in form's token (and sign-out's empty form) fit
TOKEN_LOOKUPS = 2  # bearer tokens of UNSLOTTED requests looked up in the database at once
LOOKUP_WAIT_SECONDS = 5  # such a token waits this long for a lookup, then 503 server_busy
BEARER_CHALLENGE = {"WWW-Authenticate": "Bearer"}
# answered before the body was read: the connection closes, so no client reuses it while the
# unread body is still arriving (a reused one would end in a transport error)
CLOSE = {"Connection": "close"}
UNREAD_BODY_CHALLENGE = BEARER_CHALLENGE | CLOSE
# a refusal closes its connection whether or not a body was declared: one kept open for the
# client's retry was, about once in 2,000 refusals under 200 clients, closed by the server as
# the client sent on it (a transport error, not an answer; tests/load/test_loopback_load.py)
BUSY = error_response(503, "server_busy", "the server is serving as many requests as it can; "
                      "retry shortly", {"Retry-After": "1"} | CLOSE)
