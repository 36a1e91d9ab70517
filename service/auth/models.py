"""ORM model of an API token (its sha256 hash, never the token)."""

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.db import Base, Json, Record
from service.names import NAME_LENGTH
from service.projects.models import PRINCIPAL_LENGTH, Project


class ApiToken(Record, Base):
    """A named bearer token bound to one project (its scopes hold there only), or a
    server-level one (`project_id` None: the `metrics` scope, or a server admin minted with
    `flipgate token create --server-level`); it no longer authenticates once `revoked_at` is
    set or `expires_at` (None: never) has passed. Names are per project.

    A personal token (minted by a person on the dashboard) holds its `owner`'s OpenID
    subject and the groups they had then (`owner_groups`); a token minted by `flipgate token
    create` or the API holds None in both (service.auth.personal)."""

    __tablename__ = "api_tokens"
    __table_args__ = (UniqueConstraint("project_id", "name"),
                      Index("uq_api_tokens_server_name", "name", unique=True,
                            sqlite_where=text("project_id IS NULL"),
                            postgresql_where=text("project_id IS NULL")))

    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(Json)
    revoked_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    owner: Mapped[str | None] = mapped_column(String(PRINCIPAL_LENGTH), index=True)
    owner_groups: Mapped[list[str] | None] = mapped_column(Json)
    project: Mapped[Project | None] = relationship(lazy="raise")


class EndedSession(Base):
    """A dashboard session that was signed out: its cookie, still well signed, no longer
    signs anyone in. Kept until the cookie would have expired anyway."""

    __tablename__ = "ended_sessions"

    session_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    expires_at: Mapped[datetime]


class FailedSignIn(Base):
    """A dashboard sign-in refused for its token, by client address: every API process
    counts these to throttle guessing (service.ui.session.SignInThrottle); pruned once they
    leave the throttle's window."""

    __tablename__ = "failed_signins"
    __table_args__ = (Index("ix_failed_signins_client_failed_at", "client", "failed_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    client: Mapped[str] = mapped_column(String(64))
    failed_at: Mapped[datetime]
