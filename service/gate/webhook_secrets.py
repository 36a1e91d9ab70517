"""Webhook secrets: one per line, sealed at rest with the server key (service.sealing); a
rotated secret stays valid for FLIPGATE_SECRET_GRACE_SECONDS so CI systems can be updated.
A secret that no server key opens is skipped with a warning, never an error."""

import logging
import secrets
from datetime import timedelta

from cryptography.fernet import MultiFernet
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import insert_or_conflict, utcnow
from service.gate.models import WebhookSecret
from service.registry.models import ModelLine
from service.registry.service import get_line
from service.sealing import cipher, seal, unseal

logger = logging.getLogger(__name__)


def rotate_secret(*, session: Session, settings: Settings, line_name: str) -> str:
    """A new webhook secret for the line, shown to the caller once; the one it replaces
    stays valid for the grace period."""
    line = get_line(session=session, name=line_name)
    secret, box = secrets.token_hex(32), cipher(settings)
    row = session.scalars(select(WebhookSecret).where(WebhookSecret.line_id == line.id)
                          .with_for_update()).one_or_none()
    if row is None:
        insert_or_conflict(session, WebhookSecret(line_id=line.id, secret=seal(box, secret)),
                           code="secret_changed", message="the secret changed meanwhile")
        return secret
    row.previous_secret, row.secret = row.secret, seal(box, secret)
    row.rotated_at = utcnow()
    row.previous_until = row.rotated_at + timedelta(seconds=settings.secret_grace_seconds)
    session.flush()
    return secret


def valid_secrets(*, session: Session, settings: Settings, line_name: str) -> list[str]:
    """The secrets a delivery to the named line may be signed with: the current one, and
    the previous one during its grace period (those that a server key opens)."""
    row = _line_row(session, line_name)
    if row is None:
        return []
    box = cipher(settings)
    in_grace = row.previous_secret is not None and utcnow() < row.previous_until
    sealed = [row.secret, *([row.previous_secret] if in_grace else [])]
    return [secret for secret in (_open(box, item, line_name) for item in sealed)
            if secret is not None]


def signing_secret(*, session: Session, settings: Settings, line_name: str) -> str | None:
    """The current secret of the named line (callbacks are signed with it), if any that a
    server key opens."""
    row = _line_row(session, line_name)
    return None if row is None else _open(cipher(settings), row.secret, line_name)


def _line_row(session: Session, line_name: str) -> WebhookSecret | None:
    statement = (select(WebhookSecret).join(ModelLine, ModelLine.id == WebhookSecret.line_id)
                 .where(ModelLine.name == line_name))
    return session.scalars(statement).one_or_none()


def _open(box: MultiFernet, sealed: str, line_name: str) -> str | None:
    """The secret, or None (with a warning) when no server key opens it."""
    secret = unseal(box, sealed)
    if secret is None:
        logger.warning("a webhook secret of %r opens with none of FLIPGATE_SECRET_KEY's keys; "
                       "it is skipped (rotate the line's secret, or list its old key)",
                       line_name)
    return secret
