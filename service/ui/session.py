"""The dashboard's sign-in: an API token with the read scope buys a signed, expiring session
cookie (HttpOnly, SameSite=Strict). The cookie names the token, never holds it, and is
checked on every page against the token (revoked or expired: the session ends) and against
the sessions signed out (a copied cookie does not outlive its sign-out). Failed sign-ins are
throttled per client address, counted in the database across API processes.

A person signed in with OpenID Connect (service.ui.oidc) has a cookie naming their subject
(`oidc:<subject>`): their projects and scopes are re-read from the grants on every page, so
a grant taken back takes the project away at once.

Only the dashboard's pages read this cookie: the JSON API takes bearer tokens alone, so a
cookie never authorizes a write.
"""

import base64
import hashlib
import hmac
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.auth.access import (
    Roles,
    bootstrap_admin,
    person_roles,
    require_scope,
    token_roles,
)
from service.auth.models import ApiToken, EndedSession, FailedSignIn
from service.auth.service import authenticate
from service.config import Settings
from service.db import utcnow
from service.errors import Forbidden
from service.guard import INT32_MAX
from service.projects.models import Person

COOKIE = "flipgate_session"
MAX_EXPIRY = 2**33  # unix seconds (the year 2242): any later expiry is no cookie of ours
ADMIN = "admin"
PERSON = "oidc:"  # a person's subject in a session cookie starts with it
SIGNIN_ATTEMPTS, SIGNIN_WINDOW = 5, timedelta(seconds=60)  # failed sign-ins per client
CLIENT_LENGTH = 64  # a client address as failed_signins keeps it


class SignInRequired(Exception):
    """A page was asked for without a valid session; the answer is 303 to the sign-in page,
    which says why a session that existed ended (`reason`: one of ENDED)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason


ENDED = {"expired": "Your session expired.",
         "signed_out": "You signed out.",
         "revoked": "Your session ended: its token was revoked or lost the read scope."}


@dataclass(frozen=True)
class Viewer:
    """Who is signed in (a token's name, or a person's name), the projects they may see with
    their scopes in each, and the project the page acts in (service.ui.projects)."""

    name: str
    roles: Roles = field(default_factory=dict)
    subject: str | None = None  # a person's OpenID subject (None: signed in with a token)
    email: str | None = None  # a person's e-mail, for the audit trail
    session_id: str = ""
    project: str | None = None


def sign_in(session: Session, settings: Settings, token: str) -> tuple[Viewer, str]:
    """The viewer a presented API token signs in, and the cookie value for it (expiring with
    the token at the latest); a token that is unknown, revoked or lacks the read scope is
    refused (Unauthorized / Forbidden)."""
    if _is_admin_token(settings, token):
        return Viewer(ADMIN), _cookie(settings, ADMIN, None)
    row = authenticate(session=session, token=token)
    require_scope(row, "read")
    return Viewer(row.name), _cookie(settings, str(row.id), row.expires_at)


def person_cookie(settings: Settings, person: Person) -> str:
    """The session cookie of a person who signed in with OpenID Connect."""
    return _cookie(settings, PERSON + person.subject, None)


def viewer(session: Session, settings: Settings, cookie: str | None) -> Viewer:
    """The viewer of a session cookie; SignInRequired when it is missing or forged, or (with
    the reason) expired, signed out, or its token since revoked, expired or without the read
    scope."""
    payload = _verified_payload(settings, cookie)
    if payload["exp"] <= time.time():
        raise SignInRequired("expired")
    if session.get(EndedSession, payload["sid"]) is not None:
        raise SignInRequired("signed_out")
    subject, sid = payload["sub"], payload["sid"]
    if subject == _admin_subject(settings):
        return Viewer(ADMIN, token_roles(session=session, token=bootstrap_admin()),
                      session_id=sid)
    if subject.startswith(PERSON):
        return _person_viewer(session, settings, subject.removeprefix(PERSON), sid)
    row = session.get(ApiToken, int(subject)) if _is_token_id(subject) else None
    if row is not None and row.expires_at is not None and row.expires_at <= utcnow():
        raise SignInRequired("expired")
    if row is None or row.revoked_at is not None:
        raise SignInRequired("revoked")
    try:
        require_scope(row, "read")
    except Forbidden as error:
        raise SignInRequired("revoked") from error
    return Viewer(row.name, token_roles(session=session, token=row), session_id=sid)


def _person_viewer(session: Session, settings: Settings, subject: str, sid: str) -> Viewer:
    """A signed-in person with the projects their grants give them now (every project, as
    its admin, for a member of FLIPGATE_OIDC_ADMIN_GROUP)."""
    person = session.get(Person, subject)
    if person is None:
        raise SignInRequired("revoked")
    roles = person_roles(session=session, person=person, admin_group=settings.oidc_admin_group)
    return Viewer(person.display_name or person.email or subject, roles, subject=subject,
                  email=person.email, session_id=sid)


def sign_out(session: Session, settings: Settings, cookie: str | None) -> None:
    """End the cookie's session for good (if it is a live one): kept until it would expire,
    when a later sign-out forgets it."""
    session.execute(delete(EndedSession).where(EndedSession.expires_at <= utcnow()))
    try:
        payload = _verified_payload(settings, cookie)
    except SignInRequired:
        return
    if payload["exp"] > time.time() and session.get(EndedSession, payload["sid"]) is None:
        session.add(EndedSession(session_id=payload["sid"],
                                 expires_at=datetime.fromtimestamp(payload["exp"], UTC)))


def is_signed_session(settings: Settings, cookie: str | None) -> bool:
    """Whether a session cookie is well signed and unexpired (no database read: whether it
    was signed out and whether its token still holds is checked on the page)."""
    try:
        return _verified_payload(settings, cookie)["exp"] > time.time()
    except SignInRequired:
        return False


def max_age(settings: Settings) -> int:
    """How long a session cookie lives, in seconds."""
    return int(settings.session_hours * 3600)


def _is_token_id(subject: str) -> bool:
    """Whether a subject names a token row (a decimal id within the id column's range)."""
    return subject.isdecimal() and int(subject) <= INT32_MAX


def _is_admin_token(settings: Settings, token: str) -> bool:
    admin = settings.admin_token
    return admin is not None and secrets.compare_digest(
        token.encode(), admin.get_secret_value().encode())


def _admin_subject(settings: Settings) -> str | None:
    """The admin's subject names the admin token's digest, so rotating the token ends it."""
    admin = settings.admin_token
    if admin is None:
        return None
    return f"{ADMIN}:{hashlib.sha256(admin.get_secret_value().encode()).hexdigest()[:16]}"


def _cookie(settings: Settings, subject: str, token_expires: datetime | None) -> str:
    """`subject`, a new session id and an expiry (the session's length, or the token's end
    if sooner), signed with the session key (HMAC-SHA256)."""
    subject = _admin_subject(settings) if subject == ADMIN else subject
    expires = time.time() + max_age(settings)
    if token_expires is not None:
        expires = min(expires, token_expires.replace(tzinfo=token_expires.tzinfo or UTC)
                      .timestamp())
    return signed(settings, {"sub": subject, "exp": int(expires), "sid": secrets.token_hex(16)})


def signed(settings: Settings, payload: dict) -> str:
    """`payload` as JSON, signed with the session key (HMAC-SHA256): a cookie's value."""
    encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
    return f"{encoded}.{_signature(settings, encoded)}"


def unsigned(settings: Settings, value: str | None) -> dict:
    """The payload of a value `signed` made; SignInRequired (no reason) for a missing,
    forged or malformed one."""
    encoded, _, signature = (value or "").partition(".")
    if not encoded or not hmac.compare_digest(signature.encode(),
                                              _signature(settings, encoded).encode()):
        raise SignInRequired
    try:
        payload = json.loads(base64.urlsafe_b64decode(encoded))
    except ValueError as error:
        raise SignInRequired from error
    if not isinstance(payload, dict):
        raise SignInRequired
    return payload


def csrf_token(settings: Settings, who: Viewer) -> str:
    """The token a form of the dashboard that writes must carry: bound to the session."""
    return _signature(settings, f"csrf:{who.session_id}")


def _verified_payload(settings: Settings, cookie: str | None) -> dict:
    """The {sub, exp, sid} of a well-signed cookie (expired or not); SignInRequired (no
    reason) for a missing, forged or malformed one."""
    payload = unsigned(settings, cookie)
    try:
        verified = {"sub": str(payload["sub"]), "exp": int(payload["exp"]),
                    "sid": str(payload["sid"])[:32]}
    except (ValueError, KeyError, TypeError, OverflowError) as error:
        raise SignInRequired from error
    if not 0 <= verified["exp"] < MAX_EXPIRY:
        raise SignInRequired
    return verified


def _signature(settings: Settings, encoded: str) -> str:
    key = settings.session_key.get_secret_value().encode()
    return hmac.new(key, encoded.encode(), hashlib.sha256).hexdigest()


def signin_retry_after(*, session: Session, client: str) -> int:
    """Seconds the client address must wait before its next sign-in (0: it may try now):
    after SIGNIN_ATTEMPTS failures within SIGNIN_WINDOW, until the oldest leaves the window.
    Read from the database, so every API process on it counts the same failures."""
    now = utcnow()
    oldest = session.scalars(
        select(FailedSignIn.failed_at)
        .where(FailedSignIn.client == client[:CLIENT_LENGTH],
               FailedSignIn.failed_at > now - SIGNIN_WINDOW)
        .order_by(FailedSignIn.failed_at).limit(SIGNIN_ATTEMPTS)).all()
    if len(oldest) < SIGNIN_ATTEMPTS:
        return 0
    return max(1, math.ceil((oldest[0] + SIGNIN_WINDOW - now).total_seconds()))


def record_failed_signin(*, session: Session, client: str) -> None:
    """Count a failed sign-in of the client address, and forget every failure that has left
    the window (the table holds one window's failures, whatever the traffic)."""
    now = utcnow()
    session.execute(delete(FailedSignIn).where(FailedSignIn.failed_at <= now - SIGNIN_WINDOW))
    session.add(FailedSignIn(client=client[:CLIENT_LENGTH], failed_at=now))
    session.flush()
