"""The per-host figures of requests: an ASGI middleware in front of the whole app that gives
every request its id (echoed in X-Request-ID), times it, counts it by method, route template
and status, counts the refusals of credentials and of admission by their code, and logs one
access line.

The figures are prometheus-client metrics. Under `flipgate serve` they are in its
multiprocess mode (PROMETHEUS_MULTIPROC_DIR, prepared by `serve`): each API process writes its
own files and `/metrics` answers the sum over the host's processes. Elsewhere (an app in a
test) they are this process's."""

import json
import logging
import re
import time

from prometheus_client import Counter, Histogram
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability.context import HEADER, request_id_bound, request_id_from

UNMATCHED = "unmatched"  # the route label of a path no route matches (a 404)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
AUTH_STATUSES = frozenset({401, 403})
ADMISSION_CODES = frozenset({"server_busy", "payload_too_large", "body_too_slow"})
ADMISSION_STATUSES = frozenset({408, 413, 503})
COUNTED_STATUSES = AUTH_STATUSES | ADMISSION_STATUSES  # refusals whose code is counted
PARAMETER = re.compile(r"\{[^}]+\}")  # a path parameter of a route's template
CODE = re.compile(r"[a-z][a-z0-9_]{0,47}")  # a refusal's code; anything else counts as "other"
access = logging.getLogger("flipgate.access")

REQUESTS = Counter("flipgate_http_requests", "HTTP requests answered, by method, route "
                   "template and status", ["method", "route", "status"], registry=None)
DURATION = Histogram("flipgate_http_request_duration_seconds", "Time from a request's "
                     "arrival to the end of its answer, by method and route template",
                     ["method", "route"], registry=None)
AUTH_REFUSALS = Counter("flipgate_auth_refusals", "Requests refused for their credentials "
                        "(401, 403), by the refusal's code", ["reason"], registry=None)
ADMISSION_REFUSALS = Counter("flipgate_admission_refusals", "Requests refused by admission "
                             "(server_busy, payload_too_large, body_too_slow)", ["reason"],
                             registry=None)
METRICS = (REQUESTS, DURATION, AUTH_REFUSALS, ADMISSION_REFUSALS)


class Observed:
    """The outermost middleware: request id, timing, counting (unless `counting` is False:
    FLIPGATE_METRICS=false) and the access line."""

    def __init__(self, app: ASGIApp, *, counting: bool) -> None:
        self.app, self.counting = app, counting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(Headers(scope=scope).get(HEADER))
        answer = Answer(send, request_id)
        started = time.perf_counter()
        with request_id_bound(request_id):
            try:
                await self.app(scope, receive, answer.send)
            finally:
                observe_request(scope, answer, time.perf_counter() - started, self.counting)


class Answer:
    """The `send` of one request: adds X-Request-ID to the answer and keeps its status and,
    for a refusal that is counted, its code (from the small JSON error body)."""

    def __init__(self, send: Send, request_id: str) -> None:
        self.upstream, self.request_id = send, request_id
        self.status, self.code = 500, None  # an exception that escapes the app is a 500

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message = {**message, "headers": [*message.get("headers", ()),
                                              (b"x-request-id", self.request_id.encode())]}
        elif (message["type"] == "http.response.body" and self.code is None
              and self.status in COUNTED_STATUSES):
            self.code = refusal_code(message.get("body", b""))
        await self.upstream(message)


def refusal_code(body: bytes) -> str:
    """The `code` of an error body ({"error": {"code": ...}}), or "other"."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "other"
    return code if isinstance(code, str) and CODE.fullmatch(code) else "other"


def route_of(scope: Scope) -> str:
    """The template of the route that served the request, or for one refused before routing
    (by admission) the template its path matches; never the raw path."""
    route = scope.get("route")
    return getattr(route, "path", None) or unrouted_template(scope)


def unrouted_template(scope: Scope) -> str:
    """The template of the app's OpenAPI document that the path matches (literal paths
    first), else UNMATCHED; the templates are compiled once per app."""
    state = scope["app"].state
    if not hasattr(state, "route_templates"):
        templates = sorted(scope["app"].openapi()["paths"], key=lambda path: path.count("{"))
        state.route_templates = [(template_pattern(template), template)
                                 for template in templates]
    return next((template for pattern, template in state.route_templates
                 if pattern.fullmatch(scope["path"])), UNMATCHED)


def template_pattern(template: str) -> re.Pattern[str]:
    """The paths a route template such as /models/{name} serves."""
    return re.compile("[^/]+".join(re.escape(part) for part in PARAMETER.split(template)))


def observe_request(scope: Scope, answer: Answer, seconds: float, counting: bool) -> None:
    """Count and time one answered request, and write its access line."""
    method = scope["method"] if scope["method"] in METHODS else "other"  # clients pick it
    route, status = route_of(scope), answer.status
    if counting:
        count(method, route, status, answer.code, seconds)
    access.info("%s %s %s %.1f ms", method, scope["path"], status, seconds * 1000,
                extra={"method": method, "route": route, "status": status,
                       "duration_ms": round(seconds * 1000, 3)})


def count(method: str, route: str, status: int, code: str | None, seconds: float) -> None:
    REQUESTS.labels(method, route, str(status)).inc()
    DURATION.labels(method, route).observe(seconds)
    if status in AUTH_STATUSES:
        AUTH_REFUSALS.labels(code or "other").inc()
    elif status in ADMISSION_STATUSES and code in ADMISSION_CODES:
        ADMISSION_REFUSALS.labels(code).inc()
