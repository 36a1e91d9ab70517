"""ORM model of the MLflow connector's log: deliveries received and what was done."""

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, Record
from service.names import NAME_LENGTH

DELIVERY_ID_LENGTH = 200


class MlflowEvent(Record, Base):
    """One line of the connector's append-only log on a registered model: a delivery
    received (its id kept so that it is acted on once), or an action taken."""

    __tablename__ = "mlflow_events"

    delivery_id: Mapped[str | None] = mapped_column(String(DELIVERY_ID_LENGTH), unique=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    alias: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[str] = mapped_column(String(NAME_LENGTH))
    action: Mapped[str] = mapped_column(String(32))  # received, gated, promoted, reverted
    decision_id: Mapped[int | None]
    message: Mapped[str] = mapped_column(Text, default="")
