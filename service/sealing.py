"""The server key (FLIPGATE_SECRET_KEY): what the server keeps sealed at rest (webhook
secrets, callback URLs' credentials) is encrypted with it (Fernet).

FLIPGATE_SECRET_KEY may list several keys, comma-separated, the newest first (MultiFernet):
text is sealed with the first and opened with any, so the server key rotates without
downtime. In development without one, a random key is kept in the data folder."""

import base64
import hashlib
import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from service.config import Settings

DEVELOPMENT_KEY_FILE = "secret.key"


class MissingSecretKey(RuntimeError):
    """Outside development the server needs FLIPGATE_SECRET_KEY."""


def require_secret_key(settings: Settings) -> None:
    """Refuse (MissingSecretKey) to run outside development without FLIPGATE_SECRET_KEY."""
    if settings.secret_key is None and settings.environment != "development":
        raise MissingSecretKey("set FLIPGATE_SECRET_KEY (it encrypts the webhook secrets) "
                               f"outside development (environment={settings.environment!r})")


def cipher(settings: Settings) -> MultiFernet:
    """The cipher of FLIPGATE_SECRET_KEY's keys (sealing with the first); in development
    without one, of a random key kept in the data folder (made on first use)."""
    require_secret_key(settings)
    keys = settings.secret_keys or [_development_key(settings.data_dir / DEVELOPMENT_KEY_FILE)]
    return MultiFernet([Fernet(base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest()))
                        for key in keys])


def _development_key(path: Path) -> str:
    """The key in `path`, created (readable by its owner only) by the first process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text()
    with os.fdopen(descriptor, "w") as file:
        file.write(key := secrets.token_urlsafe(32))
    return key


def seal(box: MultiFernet, secret: str) -> str:
    """`secret` encrypted with the server's newest key, as text to store."""
    return box.encrypt(secret.encode()).decode()


def unseal(box: MultiFernet, sealed: str) -> str | None:
    """What `seal` stored, or None when none of the server's keys opens it."""
    try:
        return box.decrypt(sealed.encode()).decode()
    except InvalidToken:
        return None
