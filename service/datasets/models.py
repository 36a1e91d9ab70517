"""ORM model of a registered data set."""

from enum import StrEnum

from sqlalchemy import CheckConstraint, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, Json, Record, str_enum
from service.names import NAME_LENGTH


class DatasetRole(StrEnum):
    EVAL = "eval"
    TRAIN = "train"


class Dataset(Record, Base):
    """A labeled .npz (x, y) in the artifact store, with its shape read at registration."""

    __tablename__ = "datasets"
    __table_args__ = (CheckConstraint("n >= 1", name="n"),
                      CheckConstraint("num_classes >= 1", name="num_classes"))

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    role: Mapped[DatasetRole] = mapped_column(str_enum(DatasetRole, "dataset_role"))
    sha256: Mapped[str] = mapped_column(String(64))
    n: Mapped[int]
    num_classes: Mapped[int]
    sample_shape: Mapped[list[int]] = mapped_column(Json)
