"""The audit trail of HTTP requests, written in one place for every route.

- A change: when an audited route's endpoint (every non-safe method's) returns without
  raising, having written a row in the request's transaction, service.deps adds one `ok`
  event to the request's session before it commits, so the event and the change commit
  together or not at all. Its action is the route's name, its resource the request's path.
  A request that writes no row changed nothing and writes no event, whatever its route: a
  dry run, a measurement stored or queued already (POST /compare, POST .../matrix asked
  again), a delivery received before.
- A refusal: a 403 or 404 answered to a known caller (a checked bearer token, or a caller
  a route has identified: `request.state.acting`), and a stored token refused because it was
  revoked or expired, write one `denied` event in a transaction of their own. A bearer that
  names no token is only counted (flipgate_auth_refusals_total) and logged.

An endpoint may add what the path does not say (the decision a gate took, the token a POST
minted) to its change's `details` in `request.state.audit_details` (a dict of JSON values).

The caller is `request.state.acting` (set by service.deps.require / act_in, or by a route
that resolves its project itself, such as the signed POST /gate and MLflow's webhook), else
the token the Admission middleware checked (its own project).

The dashboard's pages take no bearer token and open their own transactions, so they add
their events themselves, in the transaction of what they do: a person's sign-in with OpenID
Connect (`sign_in`, auth `oidc`, no project), the personal token a person mints and the
refusals of that form (the caller a `request.state.acting` with auth `oidc`:
record_change, record_page_refusal), and a sign-in with a revoked or expired token
(record_sign_in_refusal)."""

from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from starlette.requests import HTTPConnection, Request
from starlette.types import Scope

from service.audit.service import DENIED, OK, Caller, logger, record_event
from service.auth.models import ApiToken
from service.auth.service import TokenRefused
from service.db import session_scope
from service.errors import ServiceError
from service.observability.context import current_request_id

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DENIED_STATUSES = frozenset({403, 404})
AUDITED = "flipgate_audited"  # session.info: the request's change event was added
WROTE = "flipgate_wrote"  # session.info: the session's transaction has flushed a written row
AUTHENTICATE = "authenticate"  # the action of a token refused before any route was chosen
SIGN_IN = "sign_in"  # the action of a dashboard sign-in (a person's, or a token's refused)
CLIENT_LENGTH = 64
DETAILS = "audit_details"  # request.state: what an endpoint adds to its change's details


def is_audited(methods: set[str] | None) -> bool:
    """Whether a route's successful requests that write a row are changes that write an
    event."""
    return bool(set(methods or ()) - SAFE_METHODS)


def wrote_rows(session: Session) -> bool:
    """Whether `session`'s transaction has written a row, or will at its next flush."""
    return session.info.get(WROTE, False) or _changes_pending(session)


def _changes_pending(session: Session) -> bool:
    return bool(session.new or session.deleted) or any(session.is_modified(row)
                                                        for row in session.dirty)


@event.listens_for(Session, "before_flush")
def _note_flushed_changes(session: Session, _context: Any, _instances: Any) -> None:
    if _changes_pending(session):
        session.info[WROTE] = True


@event.listens_for(Session, "do_orm_execute")
def _note_written_statement(state: ORMExecuteState) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        state.session.info[WROTE] = True


def token_auth(token: ApiToken) -> str:
    """How a token's bearer authenticated: the bootstrap token (FLIPGATE_ADMIN_TOKEN, never
    stored) or a stored one."""
    return "admin_token" if token.id is None else "token"


def caller_of(connection: HTTPConnection) -> Caller | None:
    """Who makes a request, if the server knows them (see the module)."""
    acting = getattr(connection.state, "acting", None)
    if acting is not None:
        return Caller(actor=acting.token.name, auth=acting.auth or token_auth(acting.token),
                      project_id=key_of(acting.project), email=acting.email)
    token = getattr(connection.state, "token", None)
    return None if token is None else token_caller(token)


def token_caller(token: ApiToken) -> Caller:
    """A token's bearer, in the token's own project."""
    return Caller(actor=token.name, auth=token_auth(token), project_id=token.project_id)


def key_of(row: Any) -> int:
    """The primary key of a row, without loading it (a rolled-back request's rows are
    expired)."""
    identity = inspect(row).identity
    return row.id if identity is None else identity[0]


def client_of(connection: HTTPConnection) -> str | None:
    return connection.client.host[:CLIENT_LENGTH] if connection.client else None


def record_change(request: Request, session: Session) -> None:
    """Add the `ok` event of a request whose endpoint returned to its session (once), if its
    route is audited, its caller known and its transaction wrote a row."""
    route = request.scope.get("route")
    if (session.info.get(AUDITED) or not getattr(route, "audited", False)
            or not wrote_rows(session)):
        return
    caller = caller_of(request)
    if caller is None:
        return
    session.info[AUDITED] = True
    add_event(session, request, caller, action=route.name,
              details=getattr(request.state, DETAILS, {}))


def add_event(session: Session, connection: HTTPConnection, caller: Caller, *, action: str,
              outcome: str = OK, reason: str | None = None,
              details: dict[str, Any] | None = None) -> None:
    """Add an event of the request `connection` to `session`'s transaction: its resource the
    request's path, its details the method and `details`."""
    record_event(session, caller=caller, action=action, resource=connection.url.path,
                 outcome=outcome, reason=reason, request_id=current_request_id(),
                 client=client_of(connection),
                 details={"method": connection.scope["method"], **(details or {})})


def record_page_refusal(request: Request, session: Session, reason: str,
                        status: int = 403) -> None:
    """Add to `session` the `denied` event of a refusal a dashboard page answers itself (a
    page, not an error) to the request's known caller (`request.state.acting`)."""
    caller = caller_of(request)
    if caller is not None:
        add_event(session, request, caller, action=request.scope["route"].name,
                  outcome=DENIED, reason=reason, details={"status": status})


def record_refusal(request: Request, error: ServiceError) -> None:
    """Write the `denied` event of a 403 or 404 answered to a known caller, in a transaction
    of its own."""
    caller = caller_of(request)
    if error.status_code not in DENIED_STATUSES or caller is None:
        return
    route = request.scope.get("route")
    try:
        deny(request.app.state.sessions, request, caller,
             action=getattr(route, "name", None) or AUTHENTICATE, reason=error.code,
             status=error.status_code)
    except (OperationalError, PoolTimeout):  # the refusal is answered all the same
        logger.exception("the audit event of a refusal (%s to %s) could not be written",
                         error.code, caller.actor)


def record_token_refusal(sessions: sessionmaker[Session], scope: Scope,
                         error: TokenRefused) -> None:
    """Write the `denied` event of a stored token refused before any route was chosen,
    for being revoked or expired."""
    deny(sessions, HTTPConnection(scope), token_caller(error.token), action=AUTHENTICATE,
         reason=error.reason, status=error.status_code)


def record_sign_in_refusal(request: Request, session: Session, error: TokenRefused) -> None:
    """Add to `session` the `denied` event of a dashboard sign-in with a stored token that
    was revoked or expired."""
    add_event(session, request, token_caller(error.token), action=SIGN_IN, outcome=DENIED,
              reason=error.reason, details={"status": error.status_code})


def deny(sessions: sessionmaker[Session], connection: HTTPConnection, caller: Caller, *,
         action: str, reason: str, status: int) -> None:
    with session_scope(sessions) as session:
        add_event(session, connection, caller, action=action, outcome=DENIED, reason=reason,
                  details={"status": status})
