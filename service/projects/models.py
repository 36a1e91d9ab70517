"""ORM models of projects, their members, and the people signed in with OpenID Connect."""

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
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
