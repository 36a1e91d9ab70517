"""Liveness and readiness probes (no token needed).

Anyone may call them, so they name each component's state and kind, never a URL, host, user
name, path or the text of an error (which may hold any of these)."""

from collections.abc import Callable
from concurrent import futures
from typing import Any

import redis
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import text

from flipgate.upload_client import DIGEST_WANTED_HEADER
from service.deps import CommittingRoute

BROKER_TIMEOUT_SECONDS = 1.0
CHECK_SECONDS = 0.8
# the probes' own threads: a check that hangs (a frozen database) holds one of them, never
# the request; a few spare ones let later probes run while an earlier check still hangs
PROBES = futures.ThreadPoolExecutor(max_workers=12, thread_name_prefix="readyz")

router = APIRouter(tags=["health"], route_class=CommittingRoute)


@router.get("/healthz")
def healthz(request: Request, response: Response) -> dict[str, str]:
    """The process is up; DIGEST_WANTED_HEADER tells upload clients whether declaring a
    raw body's sha256 saves the artifact store a copy."""
    if request.app.state.store.declared_digest_saves_copy:
        response.headers[DIGEST_WANTED_HEADER] = "1"
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """The database, the broker and the artifact store answer; 503 naming those that do not.
    The checks run at once, and one that has not answered within CHECK_SECONDS fails: the
    probe answers within about a second whatever hangs."""
    checks = run_checks(request.app.state)
    failed = [name for name, outcome in checks.items() if outcome["status"] == "failed"]
    if not failed:
        return JSONResponse({"status": "ready", "checks": checks})
    error = {"code": "not_ready", "message": f"failing: {', '.join(failed)}"}
    return JSONResponse({"error": error, "checks": checks}, status_code=503)


def run_checks(state: Any) -> dict[str, dict[str, str]]:
    """Each check's outcome (see `_outcome`), all run at once, within CHECK_SECONDS (the
    probe's and the metrics' flipgate_dependency_up)."""
    pending = {name: PROBES.submit(_outcome, check, state) for name, check in CHECKS.items()}
    done, _ = futures.wait(pending.values(), timeout=CHECK_SECONDS)
    return {name: future.result() if future in done else
            {"status": "failed", "detail": f"no answer within {CHECK_SECONDS:g} s"}
            for name, future in pending.items()}


def _outcome(check: Callable[[Any], str], state: Any) -> dict[str, str]:
    """{"status": "ok" | "failed", "detail": ...} of one check; a failure is told by the
    error's type only."""
    try:
        return {"status": "ok", "detail": check(state)}
    except Exception as error:  # a probe reports every failure instead of raising it
        return {"status": "failed", "detail": f"does not answer ({type(error).__name__})"}


def _database(state: Any) -> str:
    with state.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    return state.engine.dialect.name


def _artifacts(state: Any) -> str:
    return state.store.check()


def _broker(state: Any) -> str:
    url = state.settings.redis_url
    if url is None:
        return "embedded"
    with redis.Redis.from_url(url, socket_timeout=BROKER_TIMEOUT_SECONDS,
                              socket_connect_timeout=BROKER_TIMEOUT_SECONDS) as client:
        client.ping()
    return "redis"


CHECKS = {"database": _database, "broker": _broker, "artifacts": _artifacts}
