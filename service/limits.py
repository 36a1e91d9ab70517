"""Limits on requests: the size of their bodies, enforced while they are read, and how many
are served at once (admission), with their credentials checked before any body is read."""

from collections.abc import Callable

import anyio
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flipgate.signing import HEADER as SIGNATURE_HEADER
from service.errors import Unauthorized, error_response


class RequestBodyLimit:
    """ASGI middleware that stops reading a body past `max_bytes` with a 413 HTTPException.

    The exception is raised inside the endpoint's body parsing, so the app's own handler
    renders it (FastAPI's max_body_size would answer in plain text instead).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("content-length", "")
        declared, received = (int(header) if header.isdigit() else 0), 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if max(declared, received) > self.max_bytes:
                raise HTTPException(413, f"the request body is larger than the limit of "
                                         f"{self.max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)


class Admission:
    """ASGI middleware in front of every database-backed request.

    - At most `slots` requests are served at once (fewer than the database pool's
      connections and the thread pool's threads, so an admitted request never waits for
      either); beyond that the answer is 503 `server_busy` with Retry-After at once.
    - A bearer token is checked from the headers, on its own short read-only session, before
      anything reads the body; a body sent without credentials (a bearer token or, for the
      gate, a webhook signature) and larger than SMALL_BODY_BYTES is refused with 401 without
      being read (smaller ones get the endpoint's own checks). The checked token
      waits in `request.state.token` for the route's scope check.
    - The probes (/healthz, /readyz) and the cookie-signed dashboard (/ui) skip the token
      check; the probes skip admission too, so they answer under any load.
    """

    def __init__(self, app: ASGIApp, *, slots: int,
                 authenticate: Callable[[str], object]) -> None:
        self.app = app
        self.free = slots
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBES:
            await self.app(scope, receive, send)
            return
        if self.free == 0:  # one event loop: no await between this check and the claim
            await BUSY(scope, receive, send)
            return
        self.free -= 1
        try:
            refusal = await self.check_credentials(scope)
            await (refusal or self.app)(scope, receive, send)
        finally:
            self.free += 1

    async def check_credentials(self, scope: Scope) -> ASGIApp | None:
        """A 401 response for bad or missing credentials, or None (token stored in scope)."""
        if scope["path"].startswith(COOKIE_SIGNED_PREFIX):
            return None
        headers = Headers(scope=scope)
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and presented.strip():
            try:
                token = await anyio.to_thread.run_sync(self.authenticate, presented.strip())
            except Unauthorized as error:
                return error_response(401, error.code, error.message, UNREAD_BODY_CHALLENGE)
            scope.setdefault("state", {})["token"] = token
            return None
        if _may_be_large(headers) and SIGNATURE_HEADER.lower() not in headers:
            return error_response(401, "missing_credentials", "send 'Authorization: Bearer "
                                  f"<token>' (or, to the gate, a '{SIGNATURE_HEADER}' "
                                  "signature); the body was not read", UNREAD_BODY_CHALLENGE)
        return None


def _may_be_large(headers: Headers) -> bool:
    """Whether a body may exceed SMALL_BODY_BYTES (declared so, or of undeclared length)."""
    declared = headers.get("content-length", "")
    if not declared.isdigit():
        return "transfer-encoding" in headers
    return int(declared) > SMALL_BODY_BYTES


SMALL_BODY_BYTES = 64 * 1024  # bodies up to this size get the endpoint's own checks
PROBES = frozenset({"/healthz", "/readyz"})
COOKIE_SIGNED_PREFIX = "/ui"
BEARER_CHALLENGE = {"WWW-Authenticate": "Bearer"}
# answered before the body was read: the connection closes, so no client reuses it while the
# unread body is still arriving (a reused one would end in a transport error)
CLOSE = {"Connection": "close"}
UNREAD_BODY_CHALLENGE = BEARER_CHALLENGE | CLOSE
BUSY = error_response(503, "server_busy", "the server is serving as many requests as it can; "
                      "retry shortly", {"Retry-After": "1"} | CLOSE)
