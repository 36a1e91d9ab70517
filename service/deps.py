"""Request dependencies: settings, the artifact store, one session per request, and auth.

A dependency that does no I/O is an `async def`: FastAPI runs a plain `def` dependency in a
pool thread, a hop that costs more than its work (docs/benchmarks.md, the request's steps)."""

import functools
import inspect
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import Depends, Path, Query, Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import ResponseValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.utils import is_body_allowed_for_status_code
from sqlalchemy.orm import Session
from starlette.datastructures import State

from flipgate.logits_scan import LogitsScan
from flipgate.scores import PROBABILITIES
from flipgate.upload_client import DIGEST_HEADER
from service.audit.requests import SAFE_METHODS, is_audited, record_change
from service.auth.access import (
    acting_project,
    bootstrap_admin,
    held_projects,
    knows_project,
    require_scope,
    require_server_scope,
)
from service.auth.models import ApiToken
from service.auth.service import look_up_token
from service.config import Settings
from service.db import factory_connection
from service.errors import Unauthorized, UnsupportedMediaType
from service.outbox import enqueue_after_commit
from service.projects.models import Project
from service.projects.scoping import scope_session
from service.schemas import ErrorBody
from service.storage import ArtifactStore, StagedFile, check_address

bearer = HTTPBearer(auto_error=False, description="an API token, or FLIPGATE_ADMIN_TOKEN")


async def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


async def get_store(request: Request) -> ArtifactStore:
    """The app's artifact store."""
    return request.app.state.store


RAW_BODY_TYPE = "application/octet-stream"
RAW_BODY_ROUTE: dict[str, Any] = {  # the OpenAPI entry of a route that takes a raw body
    "openapi_extra": {"requestBody": {"required": True, "content": {
        RAW_BODY_TYPE: {"schema": {"type": "string", "format": "binary"}}}}},
    "responses": {415: {"model": ErrorBody, "description": f"the body is not {RAW_BODY_TYPE} "
                        "(unsupported_media_type)"}},
}


def staged_body(filename: str, *, logits: bool = False) -> Any:
    """A dependency: the raw request body (Content-Type application/octet-stream) streamed
    to the staging file `filename` and hashed (and with `logits`, scanned: LogitsScan) in
    one pass, at most FLIPGATE_MAX_UPLOAD_MB (413 beyond); removed after the answer.
    Logits (but probabilities, which are rewritten as their logs) go to the store's
    `receive`: streamed into the bucket of an S3 store, checked from their scan. A body
    whose sha256 is not the one its X-Flipgate-Sha256 header declares is 422
    `digest_mismatch` (a malformed one `invalid_sha256`, unread). Another type is 415
    `unsupported_media_type`, unread. Routes that take it add RAW_BODY_ROUTE to their
    decorator."""

    async def staged(request: Request) -> AsyncIterator[StagedFile]:
        content_type = request.headers.get("content-type", "").partition(";")[0]
        if content_type.strip().lower() != RAW_BODY_TYPE:
            raise UnsupportedMediaType("unsupported_media_type", f"send the file as the "
                                       f"request body with Content-Type: {RAW_BODY_TYPE}")
        declared = request.headers.get(DIGEST_HEADER)
        if declared is not None:
            check_address(declared)
        store: ArtifactStore = request.app.state.store
        streamed = logits and request.query_params.get("scores") != PROBABILITIES
        receive = store.receive if streamed else store.stage_chunks
        async with receive(request.stream(), filename=filename,
                           max_bytes=request.app.state.settings.max_upload_bytes,
                           scan=LogitsScan() if logits else None,
                           declared=declared) as staged_file:
            yield staged_file

    return Depends(staged)


StagedLogits = Annotated[StagedFile, staged_body("body.npy", logits=True)]
StagedNpz = Annotated[StagedFile, staged_body("body.npz")]
StagedModel = Annotated[StagedFile, staged_body("upload")]


_request_session: ContextVar[Session | None] = ContextVar("request_session", default=None)
REQUEST = "flipgate_request"  # session.info: the request a request's session serves
SESSION = "flipgate.session"  # request.scope: the request's session and its context token


async def get_session(request: Request) -> Session:
    """One session per request, made on the first ask: committed in the endpoint's own
    thread as soon as it returns (CommittingRoute), rolled back if it raises, closed before
    the answer is sent (CommittingRoute's handler); the jobs it created are sent to the
    workers after the commit. A change's audit event joins the commit
    (service.audit.requests.record_change).

    The session connects on its first query, in a synchronous dependency or the endpoint (in
    a pool thread, never on the event loop, which a database that stops answering would hold
    for every request), and its transaction ends before the answer leaves the endpoint's
    thread: no request holds a connection or SQLite's write lock while it waits for a
    thread. Safe methods only read: their sessions (`state.readers`) begin on SQLite without
    the write lock. A plain coroutine, not a generator: FastAPI enters and leaves a
    generator dependency through an exit stack, which cost more than the session.
    """
    held = request.scope.get(SESSION)
    if held is None:
        state = request.app.state
        session = (state.readers if request.method in SAFE_METHODS else state.sessions)()
        enqueue_after_commit(session=session, celery=state.celery)
        session.info[REQUEST] = request
        held = request.scope[SESSION] = (session, _request_session.set(session))
    return held[0]


def _end_session(request: Request, *, succeeded: bool) -> None:
    """Commit (what a coroutine endpoint left) or roll back the request's session, if it
    has one, and close it."""
    held = request.scope.pop(SESSION, None)
    if held is None:
        return
    session, current = held
    try:
        if succeeded:
            _commit(session)
        else:
            session.rollback()
    finally:
        _request_session.reset(current)
        session.close()


def _commit(session: Session) -> None:
    """Commit the request's session, with the audit event of its change (once)."""
    record_change(session.info[REQUEST], session)
    session.commit()


@contextmanager
def reading(request: Request) -> Iterator[Session]:
    """A read-only session of the request's own, closed when the block ends: for what an
    endpoint reads before its session's transaction (with SQLite's write lock) begins."""
    with request.app.state.readers() as session:
        yield session


class CommittingRoute(APIRoute):
    """The route class of every router (and of the app's own routes): a synchronous endpoint
    commits the request's session in its own thread right after it returns, and renders its
    answer there too when FastAPI would render it as JSON of the response model (else
    FastAPI validates the answer in another pool thread; get_session commits what is left:
    a coroutine's session, or none). `audited`: whether its successful requests are changes
    that write an audit event (service.audit.requests)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _committing(endpoint), **kwargs)
        self.audited = is_audited(self.methods)
        if getattr(self.endpoint, "render", None) is _as_is and self.renders_json():
            self.endpoint.render = functools.partial(_rendered, self)  # type: ignore[attr-defined]

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, ending the request's session (get_session) when it is done."""
        handle = super().get_route_handler()

        async def handle_in_session(request: Request) -> Response:
            try:
                response = await handle(request)
            except BaseException:
                _end_session(request, succeeded=False)
                raise
            _end_session(request, succeeded=True)
            return response

        return handle_in_session

    def renders_json(self) -> bool:
        """Whether FastAPI answers the endpoint's return value as JSON of the response model,
        with nothing of the request's own `Response` (headers, status) to add to it."""
        return (self.response_field is not None and is_body_allowed_for_status_code(
                    self.status_code) and isinstance(self.response_class, DefaultPlaceholder)
                and not _sets_response(self.dependant))


def _sets_response(dependant: Dependant) -> bool:
    """Whether the endpoint or a dependency of it takes the request's `Response`."""
    return dependant.response_param_name is not None or any(
        _sets_response(dependency) for dependency in dependant.dependencies)


def _committing(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint`, committing the request's session when it returns, if it is synchronous,
    and rendering its answer (`render`, set by CommittingRoute)."""
    if inspect.iscoroutinefunction(endpoint) or getattr(endpoint, "commits", False):
        return endpoint

    @functools.wraps(endpoint)
    def run(*args: Any, **kwargs: Any) -> Any:
        answer = endpoint(*args, **kwargs)
        session = _request_session.get()
        if session is not None:
            _commit(session)
        return run.render(answer)  # type: ignore[attr-defined]

    run.commits = True  # type: ignore[attr-defined]  # not again where a FastAPI release
    # copies an included router's routes from their endpoints
    run.render = _as_is  # type: ignore[attr-defined]
    return run


def _as_is(answer: Any) -> Any:
    return answer


def _rendered(route: APIRoute, answer: Any) -> Any:
    """`answer` validated against `route`'s response model and rendered as the JSON response
    FastAPI makes of it (fastapi.routing.serialize_response), in the endpoint's thread."""
    if isinstance(answer, Response):
        return answer
    field = route.response_field
    value, errors = field.validate(answer, {}, loc=("response",))
    if errors:
        raise ResponseValidationError(errors=errors, body=answer)
    content = field.serialize_json(
        value, include=route.response_model_include, exclude=route.response_model_exclude,
        by_alias=route.response_model_by_alias,
        exclude_unset=route.response_model_exclude_unset,
        exclude_defaults=route.response_model_exclude_defaults,
        exclude_none=route.response_model_exclude_none)
    return Response(content, status_code=route.status_code or 200, media_type=JSON_TYPE)


JSON_TYPE = "application/json"


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_session)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def presented_token(request: Request, credentials: Credentials) -> ApiToken:
    """The token the request presents, checked by the Admission middleware from its headers
    (service.limits) before the body was read."""
    if credentials is None:
        raise Unauthorized("missing_token", "send an 'Authorization: Bearer <token>' header")
    return request.state.token


async def current_token(request: Request, credentials: Credentials) -> ApiToken:
    """The presented token, as a route dependency."""
    return presented_token(request, credentials)


def token_checker(state: State) -> Callable[[str], ApiToken]:
    """A function from a presented token to the bootstrap admin token (the server admin: bound
    to no project) or a live stored one; it reads on a connection of its own (of
    `state.readers`: on SQLite without the write lock), closed before it returns, and
    writes nothing."""

    def check(presented: str) -> ApiToken:
        admin = state.settings.admin_token
        if admin is not None and secrets.compare_digest(presented.encode(),
                                                        admin.get_secret_value().encode()):
            return bootstrap_admin()
        with factory_connection(state.readers) as connection:
            return look_up_token(connection=connection, token=presented)

    return check


TokenDep = Annotated[ApiToken, Depends(current_token)]
ProjectParam = Annotated[str | None, Query(
    description="the project the request acts in: a project-bound token's own (the "
                "default), or for a server admin any project (default: `default`)")]


WEBHOOK_AUTH = "webhook"  # how a signed delivery authenticates, for the audit trail


@dataclass(frozen=True)
class Acting:
    """Who makes a request, and the project it acts in (its session sees only that one).
    For the audit trail, `auth` says how they authenticated when not with `token` as a
    bearer (`webhook`, `session`, `oidc`), and `email` is a signed-in person's."""

    token: ApiToken
    project: Project
    auth: str | None = None
    email: str | None = None


def act_in(request: Request, session: Session, token: ApiToken, named: str | None) -> Acting:
    """Bind the request's session to the project `token` acts in (see acting_project)."""
    project = acting_project(session=session, token=token, named=named)
    scope_session(session, project.id)
    request.state.acting = Acting(token=token, project=project)
    return request.state.acting


def act_signed(request: Request, sender: str, project: Project,
               scopes: tuple[str, ...] = ()) -> Acting:
    """Make `sender` of a signed delivery (no bearer token: the signature authenticates it)
    the request's caller in `project`, for the audit trail (auth `webhook`)."""
    request.state.acting = Acting(token=ApiToken(name=sender, scopes=list(scopes),
                                                 project_id=project.id),
                                  project=project, auth=WEBHOOK_AUTH)
    return request.state.acting


def authorize(request: Request, session: Session, token: ApiToken, named: str | None,
              scope: str, *alternatives: str) -> Acting:
    """Refuse `token` without `scope`, one of `alternatives` or admin, then bind the
    request's session to the project it acts in, `named` (see act_in): the scope first, so
    a token of another project gets the same 403, then the same 404 project_not_found, as
    for a project that exists nowhere. For routes that read the project's name from their
    body; `require` is the same check as a route dependency."""
    require_scope(token, scope, *alternatives)
    return act_in(request, session, token, named)


ProjectInPath = Annotated[str, Path(description="the project: a project-bound token's own, "
                                               "or any for the server admin")]


async def project_in_query(project: ProjectParam = None) -> str | None:
    """The project a route names in its query (`?project=`), if any."""
    return project


async def project_in_path(project: ProjectInPath) -> str:
    """The project a route names in its path (`{project}`)."""
    return project


def require(scope: str, *alternatives: str, named_in: Callable[..., str | None] = project_in_query
            ) -> Any:
    """A route dependency that admits tokens with `scope`, one of `alternatives`, or admin,
    in the project the request acts in, named in its query (see ProjectParam) or, with
    `named_in=project_in_path`, its path; it binds the request's session to that project
    and gives the route that Acting (see authorize). On the event loop when that needs no
    query (a bound token, its project loaded with it), else in a pool thread."""

    async def check(request: Request, token: TokenDep, session: SessionDep,
                    project: Annotated[str | None, Depends(named_in)]) -> Acting:
        arguments = (request, session, token, project, scope, *alternatives)
        if knows_project(token):
            return authorize(*arguments)
        return await anyio.to_thread.run_sync(authorize, *arguments)

    return Depends(check)


def require_server(scope: str | None = None) -> Any:
    """A route dependency for what belongs to no project: the server admin, and with
    `scope`, tokens that hold `scope` wherever they are bound."""

    async def check(token: TokenDep) -> ApiToken:
        require_server_scope(token, scope)
        return token

    return Depends(check)


def caller_projects(session: SessionDep, token: TokenDep) -> list[tuple[Project, frozenset[str]]]:
    """The projects the caller can act in, each with the scopes it holds there."""
    return held_projects(session=session, token=token)


READ = require("read")
WRITE = require("write")
ADMIN = require("admin")
SERVER_ADMIN = require_server()
ReadAccess = Annotated[Acting, READ]
AdminAccess = Annotated[Acting, ADMIN]
CallerProjects = Annotated[list[tuple[Project, frozenset[str]]], Depends(caller_projects)]
