"""Server settings, read once from FLIPGATE_* environment variables."""

import secrets
from functools import cache
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url

from flipgate.errors import InputError

PLACEHOLDER_SECRETS = frozenset({"", "changethis", "changeme", "change-me", "secret", "admin",
                                 "password", "token", "placeholder"})
MIN_SECRET_LENGTH = 16


class Settings(BaseSettings):
    """Where the server keeps its data and how it reaches its database and broker."""

    # a refusal never prints the values it was given: they hold the keys
    model_config = SettingsConfigDict(env_prefix="FLIPGATE_", extra="ignore",
                                      hide_input_in_errors=True)

    environment: Literal["development", "staging", "production"] = "development"
    data_dir: Path = Path("flipgate-data")
    database_url: str = ""  # empty: the SQLite file <data_dir>/flipgate.db
    redis_url: str | None = None
    # PostgreSQL: a statement, commit or check-out ping that gets no answer for this long (a
    # frozen server or network path) fails, and the request is answered 503
    # `database_unavailable` (service.db_watchdog); the longest a request waits for a frozen
    # database is this plus the 3 s connect timeout
    db_statement_seconds: float = Field(default=30.0, gt=0)
    admin_token: SecretStr | None = None
    # s3://BUCKET[/PREFIX]: artifacts in an S3-compatible bucket (credentials, region and
    # endpoint from the standard AWS chain; then FLIPGATE_SECRET_KEY and FLIPGATE_SESSION_KEY
    # are required); None: the local folder <data_dir>/artifacts
    artifact_store: str | None = None
    cache_dir: Path | None = None  # the S3 store's local read cache; None: <data_dir>/cache
    cache_max_gb: float = Field(default=20.0, gt=0)  # least recently used evicted beyond it
    # one call to the S3 store that gets no answer for this long fails (connect and each
    # read); tried twice, a request waits about 2x this and a second at most, then answers
    # 503 `storage_unavailable`
    store_timeout_seconds: float = Field(default=5.0, gt=0)
    max_upload_mb: int = Field(default=512, ge=1)  # request bodies (uploads) at most
    max_decompressed_mb: int = Field(default=2048, ge=1)  # .npz arrays, model .zips, expanded
    max_repair_mb: int = Field(default=8192, ge=1)  # a retraining repair's estimated memory
    staging_idle_minutes: float = Field(default=15, gt=0)  # then an upload's files are junk
    shard_size: int = Field(default=50_000, ge=1)  # eval sets with more samples are sharded
    # samples read at a time by the metrics job and by the predicted classes (None: ~2 MB)
    metrics_chunk_rows: int | None = Field(default=None, ge=1)
    job_heartbeat_seconds: float = Field(default=5.0, gt=0)  # a running job's lease renewal
    job_lease_seconds: float = Field(default=30.0, gt=0)  # no heartbeat for this long: lost
    job_attempts: int = Field(default=3, ge=1)  # runs of a job before a lost one fails
    job_time_limit_seconds: float = Field(default=3600.0, gt=0)  # one run of a job at most
    job_resend_seconds: float = Field(default=60.0, gt=0)  # a queued job's message resent
    sweep_seconds: float = Field(default=2.0, gt=0)  # the worker's reaper and dispatcher
    public_url: str | None = None  # the API's address in links; default: links are relative
    callback_attempts: int = Field(default=6, ge=1)  # deliveries of a decision's status
    callback_backoff_seconds: float = Field(default=5.0, ge=0)  # doubled after each failure
    callback_timeout_seconds: float = Field(default=10.0, gt=0)
    # hosts or CIDRs a callback may reach although they are loopback, private or reserved
    callback_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # package.module:function factories a repair may train (zoo architectures always may)
    custom_architectures: Annotated[list[str], NoDecode] = Field(default_factory=list)
    signature_tolerance_seconds: int = Field(default=300, ge=1, le=86_400)
    # encrypts webhook secrets at rest; comma-separated, newest first, to rotate it (MultiFernet);
    # development without one: a key file in data_dir
    secret_key: SecretStr | None = None
    secret_grace_seconds: int = Field(default=3600, ge=0, le=30 * 86_400)  # old secret valid
    min_gate_samples: int = Field(default=100, ge=1)  # eval sets a default-policy gate uses
    # the MLflow connector (service.integrations.mlflow): off while the secret is unset
    mlflow_webhook_secret: SecretStr | None = None
    mlflow_tracking_uri: str | None = None  # the operator's own: no callback address checks
    mlflow_candidate_alias: str = "challenger"  # set on a version: gate it
    mlflow_promote_alias: str = "champion"  # set by flipgate on approval; else reverted
    mlflow_reconcile_seconds: float = Field(default=300, gt=0)  # the sweeper's reconcile
    mlflow_project: str = "default"  # the one project whose lines the connector serves

    @field_validator("callback_allowlist", "custom_architectures", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [item.strip() for item in value.split(",") if item.strip()] if isinstance(
            value, str) else value
    # signs the dashboard's session cookies; unset: a random key per process (sign-ins end
    # when the server restarts, and API processes behind one address must share a key)
    session_key: SecretStr = Field(default_factory=lambda: SecretStr(secrets.token_hex(32)))
    session_hours: float = Field(default=12.0, gt=0)  # a dashboard sign-in lasts this long
    # the dashboard's single sign-on (service.ui.oidc): OpenID Connect's code flow with the
    # provider at this issuer (discovered at {issuer}/.well-known/openid-configuration); off
    # while the issuer is unset. Members of the admin group are server admins in the dashboard
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: SecretStr | None = None
    oidc_groups_claim: str = "groups"  # the ID token's claim that lists a person's groups
    oidc_admin_group: str | None = None
    # a request body must arrive within body_grace_seconds plus one second per
    # body_min_rate bytes received (slower: 408), and within body_deadline_seconds in all
    body_grace_seconds: float = Field(default=10.0, gt=0)
    body_min_rate: int = Field(default=16 * 1024, ge=1)  # bytes per second
    body_deadline_seconds: float = Field(default=600.0, gt=0)
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)  # open requests after SIGTERM
    # operations (service.observability): log lines as text for a terminal or one JSON object
    # each; request figures counted for GET /metrics; traces, with the `otel` extra, sent to
    # OpenTelemetry's own OTEL_EXPORTER_OTLP_ENDPOINT (unset: no trace, nothing of it imported)
    log_format: Literal["text", "json"] = "text"
    metrics: bool = True
    otel_endpoint: str | None = Field(default=None,
                                      validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")

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

    @model_validator(mode="after")
    def _refuse_placeholder_secret_key(self) -> Self:
        if any(key.lower() in PLACEHOLDER_SECRETS or len(key) < MIN_SECRET_LENGTH
               for key in self.secret_keys):
            raise ValueError(f"FLIPGATE_SECRET_KEY: each comma-separated key must be a real "
                             f"secret of at least {MIN_SECRET_LENGTH} characters")
        return self

    @model_validator(mode="after")
    def _require_an_oidc_client(self) -> Self:
        if self.oidc_issuer and not self.oidc_client_id:
            raise ValueError("FLIPGATE_OIDC_CLIENT_ID must be set with FLIPGATE_OIDC_ISSUER")
        return self

    @model_validator(mode="after")
    def _require_shared_keys_with_a_bucket(self) -> Self:
        """With artifacts in a bucket, API processes and workers run on several hosts and
        must share the keys that each would otherwise make for itself."""
        if not (self.artifact_store or "").startswith("s3://"):
            return self
        missing = [name for name, given in (
            ("FLIPGATE_SECRET_KEY", self.secret_key is not None),
            ("FLIPGATE_SESSION_KEY", "session_key" in self.model_fields_set)) if not given]
        if missing:
            raise ValueError(f"FLIPGATE_SECRET_KEY and FLIPGATE_SESSION_KEY must both be set "
                             f"when FLIPGATE_ARTIFACT_STORE is an S3 bucket: every API process "
                             f"and worker must share them (missing: {', '.join(missing)})")
        return self

    @property
    def secret_keys(self) -> list[str]:
        """FLIPGATE_SECRET_KEY's comma-separated keys, newest first (none without it)."""
        value = self.secret_key and self.secret_key.get_secret_value()
        return [] if value is None else [key.strip() for key in value.split(",")]

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 2**20

    @property
    def max_decompressed_bytes(self) -> int:
        return self.max_decompressed_mb * 2**20

    @property
    def link_base(self) -> str:
        """What every link the server writes starts with: FLIPGATE_PUBLIC_URL, else "/" (links
        relative to the server; a request's Host header never makes a link)."""
        return self.public_url.rstrip("/") + "/" if self.public_url else "/"

    @property
    def safe_database_url(self) -> str:
        """The database URL with any password masked, for messages."""
        return make_url(self.database_url).render_as_string(hide_password=True)

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def artifact_cache_dir(self) -> Path:
        return self.cache_dir or self.data_dir / "cache"


@cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use; settings the
    environment gets wrong are an InputError `invalid_settings` that names them in one line
    (the `flipgate` command prints it as its error)."""
    try:
        return Settings()
    except ValidationError as error:
        raise InputError("invalid_settings", settings_problems(error)) from error


def settings_problems(error: ValidationError) -> str:
    """What is wrong with the settings, one line: each problem with the variable it is about
    (the values are never shown: they may be secrets)."""
    return "; ".join(
        (f"FLIPGATE_{str(problem['loc'][0]).upper()}: " if problem["loc"] else "")
        + problem["msg"].removeprefix("Value error, ") for problem in error.errors())
