"""ORM model of the audit trail."""

from typing import Any

from sqlalchemy import ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, Record
from service.names import NAME_LENGTH
from service.projects.models import EMAIL_LENGTH, PRINCIPAL_LENGTH


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
