"""The callbacks' rows: one per final decision with a callback URL, with its attempts."""

from datetime import datetime
from enum import StrEnum

from sqlalchemy import ForeignKey, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, Record, str_enum


class CallbackState(StrEnum):
    QUEUED = "queued"
    DELIVERED = "delivered"
    FAILED = "failed"


class Callback(Record, Base):
    """The delivery of a final decision's status to its callback URL, with its attempts; a
    queued one is (re)sent by the worker's sweeper once `due_at` has passed."""

    __tablename__ = "gate_callbacks"

    decision_id: Mapped[int] = mapped_column(ForeignKey("gate_decisions.id"), unique=True)
    state: Mapped[CallbackState] = mapped_column(str_enum(CallbackState, "callback_state"),
                                                 default=CallbackState.QUEUED)
    attempts: Mapped[int] = mapped_column(default=0)
    last_status: Mapped[int | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None]
    due_at: Mapped[datetime | None]
