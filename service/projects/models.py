"""ORM models of projects, their members, the people signed in with OpenID Connect, and the
audit trail."""

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from service.db import Base, Json, Record
from service.names import NAME_LENGTH

DEFAULT_PROJECT = "default"  # where an upgrade puts what existed, and a signed /gate's default
PRINCIPAL_LENGTH = 255  # a group name or an OpenID subject
EMAIL_LENGTH = 320


class Project(Record, Base):
    """A team's namespace: it owns lines and data sets, and through them everything else."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)


class ProjectOwned:
    """A row of one project: requests acting in another never see it
    (service.projects.scoping)."""

    @declared_attr
    def project_id(cls) -> Mapped[int]:
        return mapped_column(ForeignKey("projects.id"), index=True)


class ProjectMember(Record, Base):
    """A role in a project granted to a group name or to one person's OpenID subject; stored
    by name, so a group's grant holds before anyone of it has signed in."""

    __tablename__ = "project_members"
    __table_args__ = (UniqueConstraint("project_id", "kind", "principal"),)

    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # "group" | "subject"
    principal: Mapped[str] = mapped_column(String(PRINCIPAL_LENGTH))
    role: Mapped[str] = mapped_column(String(16))


class Person(Base):
    """Someone who signed in to the dashboard with OpenID Connect: their claims at the last
    sign-in (groups are re-read at each one)."""

    __tablename__ = "people"

    subject: Mapped[str] = mapped_column(String(PRINCIPAL_LENGTH), primary_key=True)
    email: Mapped[str | None] = mapped_column(String(EMAIL_LENGTH))
    display_name: Mapped[str | None] = mapped_column(String(PRINCIPAL_LENGTH))
    groups: Mapped[list[str]] = mapped_column(Json)
    signed_in_at: Mapped[datetime]


class AuditEvent(Record, Base):
    """One change, or one refused request of a known caller: written with the change (or in
    a transaction of its own for a refusal) and never updated or deleted."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_project_id_id", "project_id", "id"),)

    actor: Mapped[str] = mapped_column(String(PRINCIPAL_LENGTH))
    actor_email: Mapped[str | None] = mapped_column(String(EMAIL_LENGTH))
    auth: Mapped[str] = mapped_column(String(16))  # how the actor authenticated
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"))
    action: Mapped[str] = mapped_column(String(64))
    resource: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(String(16))  # "ok" | "denied"
    reason: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    request_id: Mapped[str | None] = mapped_column(String(128))
    client: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any] | None]
