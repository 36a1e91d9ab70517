"""ORM models of the gate: versioned policies, webhook secrets, decisions and promotions."""

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, Json, Record, str_enum
from service.names import NAME_LENGTH
from service.projects.models import ProjectOwned

DELIVERY_LENGTH = 200


class Verdict(StrEnum):
    APPROVE = "approve"
    BLOCK = "block"
    PENDING = "pending"


class GatePolicy(Record, Base):
    """One version of a line's policy; a new PUT adds a version, none is ever changed."""

    __tablename__ = "gate_policies"
    __table_args__ = (UniqueConstraint("line_id", "version"),)

    line_id: Mapped[int] = mapped_column(ForeignKey("model_lines.id"))
    version: Mapped[int]
    rules: Mapped[dict[str, Any]]
    created_by: Mapped[str] = mapped_column(String(NAME_LENGTH))


class WebhookSecret(Record, Base):
    """The secret a line's webhook deliveries are signed with (HMAC-SHA256), encrypted with
    the server key; after a rotation the previous one stays valid until `previous_until`."""

    __tablename__ = "webhook_secrets"

    line_id: Mapped[int] = mapped_column(ForeignKey("model_lines.id"), unique=True)
    secret: Mapped[str] = mapped_column(Text)
    rotated_at: Mapped[datetime | None]
    previous_until: Mapped[datetime | None]
    previous_secret: Mapped[str | None] = mapped_column(Text)


class Decision(ProjectOwned, Record, Base):
    """One answer of the gate: append-only, and never changed once its verdict is final.
    A delivery id names one decision of its line, so a retried webhook finds it again; a
    signed request (the digest of its body and signing time) makes one decision at most."""

    __tablename__ = "gate_decisions"
    __table_args__ = (UniqueConstraint("line_id", "delivery_id"),
                      UniqueConstraint("line_id", "signature_digest"))

    line_id: Mapped[int] = mapped_column(ForeignKey("model_lines.id"))
    candidate_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    baseline_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    verdict: Mapped[Verdict] = mapped_column(str_enum(Verdict, "verdict"), index=True)
    reasons: Mapped[list[dict[str, Any]]] = mapped_column(Json)
    metrics: Mapped[dict[str, Any]]
    evalsets: Mapped[list[str]] = mapped_column(Json)
    policy_version: Mapped[int | None]
    policy: Mapped[dict[str, Any]]
    requested_by: Mapped[str] = mapped_column(String(NAME_LENGTH))
    ci: Mapped[dict[str, Any] | None]
    callback_url: Mapped[str | None] = mapped_column(Text)  # as shown: no password or query
    callback_url_sealed: Mapped[str | None] = mapped_column(Text)  # the whole URL, encrypted
    delivery_id: Mapped[str | None] = mapped_column(String(DELIVERY_LENGTH))
    request_sha256: Mapped[str] = mapped_column(String(64))
    signature_digest: Mapped[str | None] = mapped_column(String(64))  # a webhook's, its v1=
    base_url: Mapped[str] = mapped_column(Text)
    repair_of_id: Mapped[int | None] = mapped_column(ForeignKey("gate_decisions.id"))
    decided_at: Mapped[datetime | None] = mapped_column(index=True)  # GET /metrics
    request_id: Mapped[str | None] = mapped_column(String(128))  # the gate request's, for
    # its callback's X-Request-ID


class DecisionJob(Base):
    """A job a pending decision waits for."""

    __tablename__ = "gate_decision_jobs"

    decision_id: Mapped[int] = mapped_column(ForeignKey("gate_decisions.id"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True, index=True)


class Promotion(Record, Base):
    """A move of a line's production alias: the decision that allowed it, or `forced`."""

    __tablename__ = "promotions"

    line_id: Mapped[int] = mapped_column(ForeignKey("model_lines.id"), index=True)
    from_version_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    to_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("gate_decisions.id"))
    forced: Mapped[bool]
    requested_by: Mapped[str] = mapped_column(String(NAME_LENGTH))
