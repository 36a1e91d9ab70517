"""The dashboard's sign-in: an API token with the read scope buys a signed, expiring session
cookie (HttpOnly, SameSite=Strict). The cookie names the token, never holds it, and is
checked against the token on every page, so revoking the token ends the session.

Only the dashboard's pages read this cookie: the JSON API takes bearer tokens alone, so a
cookie never authorizes a write.
"""

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.auth.models import ApiToken
from service.auth.service import authenticate, require_scope
from service.config import Settings
from service.errors import Forbidden

COOKIE = "flipgate_session"
ADMIN = "admin"


class SignInRequired(Exception):
    """A page was asked for without a valid session; the answer is 303 to the sign-in page."""


@dataclass(frozen=True)
class Viewer:
    """Who is signed in: the token's name."""

    name: str


def sign_in(session: Session, settings: Settings, token: str) -> tuple[Viewer, str]:
    """The viewer a presented API token signs in, and the cookie value for it; a token that
    is unknown, revoked or lacks the read scope is refused (Unauthorized / Forbidden)."""
    if _is_admin_token(settings, token):
        return Viewer(ADMIN), _cookie(settings, ADMIN)
    row = authenticate(session=session, token=token)
    require_scope(row, "read")
    return Viewer(row.name), _cookie(settings, str(row.id))


def viewer(session: Session, settings: Settings, cookie: str | None) -> Viewer:
    """The viewer of a session cookie; SignInRequired when it is missing, forged, expired,
    or its token has since been revoked or lost the read scope."""
    subject = _verified_subject(settings, cookie)
    if subject is None:
        raise SignInRequired
    if subject == _admin_subject(settings):
        return Viewer(ADMIN)
    row = session.get(ApiToken, int(subject)) if subject.isdigit() else None
    if row is None or row.revoked_at is not None:
        raise SignInRequired
    try:
        require_scope(row, "read")
    except Forbidden as error:
        raise SignInRequired from error
    return Viewer(row.name)


def is_signed_session(settings: Settings, cookie: str | None) -> bool:
    """Whether a session cookie is well signed and unexpired (no database read: whether its
    token still holds is checked on the page)."""
    return _verified_subject(settings, cookie) is not None


def max_age(settings: Settings) -> int:
    """How long a session cookie lives, in seconds."""
    return int(settings.session_hours * 3600)


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


def _cookie(settings: Settings, subject: str) -> str:
    """`subject` and an expiry, signed with the session key (HMAC-SHA256)."""
    subject = _admin_subject(settings) if subject == ADMIN else subject
    payload = json.dumps({"sub": subject, "exp": int(time.time()) + max_age(settings)})
    encoded = base64.urlsafe_b64encode(payload.encode()).decode()
    return f"{encoded}.{_signature(settings, encoded)}"


def _verified_subject(settings: Settings, cookie: str | None) -> str | None:
    """The subject of a well-signed, unexpired cookie, else None."""
    encoded, _, signature = (cookie or "").partition(".")
    if not encoded or not hmac.compare_digest(signature, _signature(settings, encoded)):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(encoded))
        subject, expires = str(payload["sub"]), int(payload["exp"])
    except (ValueError, KeyError, TypeError):
        return None
    return subject if expires > time.time() else None


def _signature(settings: Settings, encoded: str) -> str:
    key = settings.session_key.get_secret_value().encode()
    return hmac.new(key, encoded.encode(), hashlib.sha256).hexdigest()

