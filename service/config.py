"""Server settings, read once from FLIPGATE_* environment variables."""

import secrets
from functools import cache
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

PLACEHOLDER_SECRETS = frozenset({"", "changethis", "changeme", "change-me", "secret", "admin",
                                 "password", "token", "placeholder"})
MIN_SECRET_LENGTH = 16


class Settings(BaseSettings):
    """Where the server keeps its data and how it reaches its database and broker."""

    model_config = SettingsConfigDict(env_prefix="FLIPGATE_", extra="ignore")

    environment: Literal["development", "staging", "production"] = "development"
    data_dir: Path = Path("flipgate-data")
    database_url: str = ""  # empty: the SQLite file <data_dir>/flipgate.db
    redis_url: str | None = None
    admin_token: SecretStr | None = None
    max_upload_mb: int = 512
    shard_size: int = Field(default=50_000, ge=1)  # eval sets with more samples are sharded
    public_url: str | None = None  # the API's address in links; default: the request's
    callback_attempts: int = Field(default=6, ge=1)  # deliveries of a decision's status
    callback_backoff_seconds: float = Field(default=5.0, ge=0)  # doubled after each failure
    callback_timeout_seconds: float = Field(default=10.0, gt=0)
    # signs the dashboard's session cookies; unset: a random key per process (sign-ins end
    # when the server restarts, and API processes behind one address must share a key)
    session_key: SecretStr = Field(default_factory=lambda: SecretStr(secrets.token_hex(32)))
    session_hours: float = Field(default=12.0, gt=0)  # a dashboard sign-in lasts this long

    @model_validator(mode="after")
    def _default_database(self) -> Self:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.data_dir / 'flipgate.db').resolve()}"
        return self

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Self:
        if self.environment == "development" or self.admin_token is None:
            return self
        token = self.admin_token.get_secret_value()
        if token.lower() in PLACEHOLDER_SECRETS or len(token) < MIN_SECRET_LENGTH:
            raise ValueError(f"FLIPGATE_ADMIN_TOKEN is a placeholder or shorter than "
                             f"{MIN_SECRET_LENGTH} characters; set a real secret outside "
                             f"development (environment={self.environment!r})")
        return self

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 2**20

    @property
    def safe_database_url(self) -> str:
        """The database URL with any password masked, for messages."""
        return make_url(self.database_url).render_as_string(hide_password=True)

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"


@cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
