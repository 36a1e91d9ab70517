"""The FastAPI application: routers, error rendering and the database check at start-up."""

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from http import HTTPStatus

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException

import flipgate
from service import health
from service.audit.requests import record_refusal
from service.audit.router import router as audit_router
from service.auth.router import router as auth_router
from service.celery_app import create_celery_app
from service.compare.router import router as compare_router
from service.config import Settings, get_settings
from service.datasets.router import router as datasets_router
from service.db import (
    create_db_engine,
    create_session_factory,
)
from service.deps import CommittingRoute, token_checker
from service.errors import (
    ServiceError,
    StorageUnavailable,
    Unauthorized,
    database_refusal,
    describe_problems,
    error_response,
    storage_full_refusal,
)
from service.gate.promotion_router import router as promotion_router
from service.gate.router import router as gate_router
from service.guard import check_request_scalars
from service.housekeeping import sweep_abandoned_uploads
from service.integrations.mlflow.router import router as mlflow_router
from service.jobs.router import router as jobs_router
from service.limits import Admission, RequestBodyLimit
from service.metrics.router import metrics_registry
from service.metrics.router import router as metrics_router
from service.migrate import check_current
from service.observability.http import Observed
from service.observability.startup import configure_logging, start_process, trace_app
from service.predictions.router import router as predictions_router
from service.projects.router import router as projects_router
from service.registry.router import router as registry_router
from service.schemas import ErrorBody
from service.sealing import require_secret_key
from service.storage import ArtifactStore, open_store
from service.ui.audit import router as audit_page_router
from service.ui.router import mount_dashboard

FORM_OVERHEAD_BYTES = 1 << 20  # form fields and multipart boundaries beside the file
ROUTERS = (registry_router, datasets_router, predictions_router, compare_router, gate_router,
           promotion_router, jobs_router, auth_router, projects_router, audit_router,
           mlflow_router,
           health.router)
TAGS = [
    {"name": "models", "description": "model lines, versions (ONNX) and aliases"},
    {"name": "evalsets", "description": "labeled eval sets and training sets (.npz)"},
    {"name": "predictions", "description": "logits of a version on an eval set"},
    {"name": "compare", "description": "pair reports and a line's pairwise matrices"},
    {"name": "gate", "description": "policies, the CI webhook, decisions, promotion, repair"},
    {"name": "jobs", "description": "background work and its progress"},
    {"name": "auth", "description": "API tokens, each bound to one project (docs/access.md)"},
    {"name": "projects", "description": "projects and the roles granted in them"},
    {"name": "audit", "description": "the audit trail: every change and every refusal"},
    {"name": "integrations", "description": "the MLflow connector: its webhook and its log"},
    {"name": "health", "description": "liveness and readiness probes"},
]
HTTP_ERROR_CODES = {408: "body_too_slow", 413: "payload_too_large"}
REFUSALS = {
    400: "a body that cannot be parsed (malformed multipart)",
    401: "no valid token or signature (unauthorized)",
    403: "the token lacks the scope (forbidden)",
    404: "the named thing does not exist",
    408: "the body arrived too slowly (body_too_slow)",
    409: "clashes with what is stored",
    413: "the upload is over the size limit (payload_too_large)",
    422: "the request is refused: its code says why",
    503: "the database or the artifact store is busy or unreachable; retry (Retry-After)",
    507: "the server's storage is full (storage_full); nothing was kept",
}
PROBE_REFUSALS = (422, 503)
# requests served at once: well below the pool's connections and the 40 threads, and few
# enough that their threads leave the GIL to the event loop, which answers the rest 503 at once
ADMITTED_REQUESTS = 4
logger = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Refuse to serve a database that is not migrated, or without the key of the webhook
    secrets outside development; sweep this host's abandoned uploads while serving; release
    connections at exit."""
    check_current(app.state.engine)
    require_secret_key(app.state.settings)
    sweeper = asyncio.create_task(sweep_staged_uploads(app.state.store, app.state.settings))
    yield
    sweeper.cancel()
    app.state.engine.dispose()
    app.state.celery.close()


async def sweep_staged_uploads(store: ArtifactStore, settings: Settings) -> None:
    """At start and then every half idle period: remove this host's partial files of uploads
    that stopped writing (a killed server's, or a client that went away), unless another
    process of the host just did (a bucket's leftovers are the worker's sweeper's)."""
    idle_seconds = settings.staging_idle_minutes * 60
    while True:
        try:
            await asyncio.to_thread(sweep_abandoned_uploads, store=store,
                                    idle_seconds=idle_seconds)
        except OSError:
            logger.exception("could not sweep abandoned uploads")
        await asyncio.sleep(idle_seconds / 2)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The flipgate API on the database and artifact store of `settings` (default: env)."""
    settings = settings or get_settings()
    traced = start_process(settings, "api", logs=False)  # before the engine: its statements
    app = FastAPI(title="flipgate", version=flipgate.__version__, openapi_tags=TAGS,
                  lifespan=lifespan, description="A regression gate for classifier updates.",
                  dependencies=[Depends(check_request_scalars)],
                  docs_url=None, redoc_url=None)  # offline copies: service.ui.docs
    app.router.route_class = CommittingRoute
    app.add_middleware(RequestBodyLimit, settings=settings,
                       max_bytes=settings.max_upload_bytes + FORM_OVERHEAD_BYTES)
    app.state.settings, app.state.engine = settings, create_db_engine(settings)
    app.state.sessions = create_session_factory(app.state.engine)
    app.state.readers = create_session_factory(app.state.engine, writes=False)
    app.add_middleware(Admission, slots=ADMITTED_REQUESTS, state=app.state,
                       authenticate=token_checker(app.state))
    app.state.store = open_store(settings)
    app.state.celery = create_celery_app(settings)
    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(OperationalError, database_error)
    app.add_exception_handler(PoolTimeout, database_error)
    app.add_exception_handler(OSError, storage_error)
    for router in ROUTERS:
        app.include_router(router, responses=documented_refusals(
            PROBE_REFUSALS if router is health.router else REFUSALS))
    mount_dashboard(app)
    app.include_router(audit_page_router)
    observe(app, settings, traced)
    return app


def serve_app() -> FastAPI:
    """The app `flipgate serve` runs in each API process, with the process's log lines in
    FLIPGATE_LOG_FORMAT (an app made by `create_app` alone keeps its caller's logging)."""
    settings = get_settings()
    configure_logging(settings.log_format, "api")
    return create_app(settings)


def observe(app: FastAPI, settings: Settings, traced: bool) -> None:
    """Request ids, access lines and (unless FLIPGATE_METRICS=false) the request figures
    and GET /metrics on every request; spans when traces are on (service.observability)."""
    if settings.metrics:
        app.state.metrics = metrics_registry(app.state)
        app.include_router(metrics_router, responses=documented_refusals((401, 403, 503)))
    app.add_middleware(Observed, counting=settings.metrics)  # the outermost: sees every answer
    if traced:
        trace_app(app)


def documented_refusals(statuses: Iterable[int]) -> dict[int | str, dict]:
    """The OpenAPI entries of the error responses a router's endpoints may give, each with the
    ErrorBody schema (a route's own entry for a status replaces these)."""
    return {status: {"model": ErrorBody, "description": REFUSALS[status]}
            for status in statuses}


def service_error(request: Request, error: ServiceError) -> JSONResponse:
    """A typed service error with its own status and code (a 403 or 404 of a known caller
    is written to the audit trail first)."""
    record_refusal(request, error)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, Unauthorized) else None
    if isinstance(error, StorageUnavailable):
        headers = {"Retry-After": str(error.retry_after_seconds)}
    return error_response(error.status_code, error.code, error.message, headers)


def storage_error(_request: Request, error: OSError) -> JSONResponse:
    """A full disk, quota or file-size limit is 507 `storage_full`: the upload's partial
    files are gone already; any other OS error is a plain 500 that names no path."""
    if (refusal := storage_full_refusal(error)) is not None:
        return refusal
    logger.exception("unexpected OS error")
    return error_response(500, "internal_error", f"the server failed ({type(error).__name__})")


def validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
    """A request whose parameters or form fields do not parse."""
    return error_response(422, "invalid_request", describe_problems(error.errors()))


def http_error(_request: Request, error: HTTPException) -> JSONResponse:
    """Framework refusals: unknown routes, wrong methods, bodies over the size limit (and a
    form whose spool the server's storage refused: 507, errors.storage_full_refusal)."""
    if (refusal := storage_full_refusal(error.__cause__)) is not None:
        return refusal
    status = error.status_code
    code = HTTP_ERROR_CODES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_")
    return error_response(status, code, str(error.detail), error.headers)


def database_error(_request: Request, error: OperationalError | PoolTimeout) -> JSONResponse:
    """The database cannot serve the request now: 503, retry later (errors.database_refusal)."""
    return database_refusal(error)
