"""Creating, checking, expiring and revoking API tokens."""

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.orm import Session, joinedload, make_transient_to_detached

from service.auth.models import ApiToken
from service.db import Row, insert_or_conflict, one_or_not_found, utcnow
from service.errors import InvalidInput, Unauthorized
from service.names import check_name
from service.projects.models import DEFAULT_PROJECT, Project
from service.projects.service import get_project

# `metrics` reads GET /metrics and nothing else (server-level, wherever the token is bound);
# a token bound to no project holds `admin` (the server admin) or `metrics` only
SCOPES = ("read", "write", "gate", "admin", "metrics")
SERVER_SCOPES = ("admin", "metrics")
TOKEN_PREFIX = "fg_"


def hash_token(token: str) -> str:
    """The sha256 hex digest under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(*, session: Session, name: str, scopes: list[str],
                 project: str | None = DEFAULT_PROJECT,
                 expires_in: timedelta | None = None) -> tuple[ApiToken, str]:
    """A new token row bound to the project named `project` (None: a server-level token) and
    its plaintext, which is shown this once and never stored; with `expires_in` it stops
    authenticating that long from now."""
    check_name(name, "token_name")
    project_id = None if project is None else get_project(session=session, name=project).id
    allowed = SCOPES if project_id is not None else SERVER_SCOPES
    if not scopes or not set(scopes) <= set(allowed):
        where = "a project's token" if project_id is not None else "a server-level token"
        raise InvalidInput("invalid_scopes", f"the scopes of {where} must be a non-empty "
                           f"subset of {allowed}, not {scopes}")
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidInput("invalid_expiry", f"a token must expire in the future, not in "
                           f"{expires_in}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = None if expires_in is None else utcnow() + expires_in
    row = ApiToken(name=name, token_hash=hash_token(token), scopes=sorted(set(scopes)),
                   expires_at=expires_at, project_id=project_id)
    return insert_or_conflict(session, row, code="token_exists",
                              message=f"a token named {name!r} exists"), token


class TokenRefused(Unauthorized, status_code=401):
    """A stored token that no longer authenticates: its caller is known (`token`, for the
    audit trail), `reason` says why (token_revoked, token_expired); a revoked one is answered
    with the code of an unknown one."""

    def __init__(self, code: str, message: str, *, token: ApiToken, reason: str) -> None:
        super().__init__(code, message)
        self.token, self.reason = token, reason


UNKNOWN_TOKEN = ("invalid_token", "the token is unknown or revoked")


def authenticate(*, session: Session, token: str) -> ApiToken:
    """The live token row for a presented token, with its project (Unauthorized for an
    unknown one, TokenRefused for a revoked or expired one).

    The lookup compares sha256 digests, not the secret itself, so its timing tells an
    attacker nothing about a valid token.
    """
    statement = (select(ApiToken).where(ApiToken.token_hash == hash_token(token))
                 .options(joinedload(ApiToken.project)))
    return live_token(session.scalars(statement).one_or_none())


TOKEN_COLUMNS = tuple(ApiToken.__table__.c)
PROJECT_COLUMNS = tuple(Project.__table__.c)
TOKEN_LOOKUP = (select(*TOKEN_COLUMNS, *PROJECT_COLUMNS)
                .outerjoin(Project.__table__, Project.id == ApiToken.project_id)
                .where(ApiToken.token_hash == bindparam("digest")))


def look_up_token(*, connection: Connection, token: str) -> ApiToken:
    """What `authenticate` answers, read by one Core statement on `connection` (a quarter
    of the ORM's time per request): the token and its project as detached rows, as a
    closed session leaves them."""
    row = connection.execute(TOKEN_LOOKUP, {"digest": hash_token(token)}).one_or_none()
    if row is None:
        return live_token(None)
    split = len(TOKEN_COLUMNS)
    project = None if row[split] is None else _detached(Project, PROJECT_COLUMNS, row[split:])
    return live_token(_detached(ApiToken, TOKEN_COLUMNS, row[:split], project=project))


def _detached(model: type[Row], columns: tuple, values: tuple, **related: object) -> Row:
    """A row of `model` with `values` for `columns`, detached as if loaded and its session
    closed."""
    row = model(**{column.key: value for column, value in zip(columns, values, strict=True)},
                **related)
    make_transient_to_detached(row)
    return row


def live_token(found: ApiToken | None) -> ApiToken:
    """`found` if it still authenticates (see authenticate)."""
    if found is None:
        raise Unauthorized(*UNKNOWN_TOKEN)
    if found.revoked_at is not None:
        raise TokenRefused(*UNKNOWN_TOKEN, token=found, reason="token_revoked")
    if found.expires_at is not None and found.expires_at <= utcnow():
        raise TokenRefused("token_expired", f"token {found.name!r} expired at "
                           f"{found.expires_at:%Y-%m-%d %H:%M:%S} UTC", token=found,
                           reason="token_expired")
    return found


def project_tokens(*, session: Session, project_id: int) -> list[ApiToken]:
    """The tokens bound to the project `project_id`, by name."""
    return list(session.scalars(select(ApiToken).where(ApiToken.project_id == project_id)
                                .order_by(ApiToken.name)))


def revoke_token(*, session: Session, name: str,
                 project: str | None = DEFAULT_PROJECT) -> ApiToken:
    """Stop the token `name` of the project named `project` (None: a server-level one) from
    authenticating; the row stays for the audit trail."""
    project_id = None if project is None else get_project(session=session, name=project).id
    token = one_or_not_found(session, select(ApiToken).where(
        ApiToken.name == name, ApiToken.project_id.is_(None) if project_id is None
        else ApiToken.project_id == project_id),
        code="token_not_found", message=f"no token named {name!r}")
    token.revoked_at = token.revoked_at or utcnow()
    session.flush()
    return token
