"""ORM model of a registered data set."""

from enum import StrEnum

from sqlalchemy import CheckConstraint, ForeignKey, String, UniqueConstraint, false, true
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, Json, Record, str_enum
from service.names import NAME_LENGTH
from service.projects.models import ProjectOwned


class DatasetRole(StrEnum):
    EVAL = "eval"
    TRAIN = "train"


class Dataset(ProjectOwned, Record, Base):
    """An .npz (x, y) in the artifact store, with its shape read at registration; without
    y a traffic set (`labeled` false: its class count is the models', None here); with a
    0/1 matrix y (N, L) a multi-label set (`multilabel`)."""

    __tablename__ = "datasets"
    __table_args__ = (CheckConstraint("n >= 1", name="n"),
                      CheckConstraint("num_classes >= 1", name="num_classes"),
                      UniqueConstraint("project_id", "name"))

    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    role: Mapped[DatasetRole] = mapped_column(str_enum(DatasetRole, "dataset_role"))
    sha256: Mapped[str] = mapped_column(String(64))
    n: Mapped[int]
    num_classes: Mapped[int | None]
    sample_shape: Mapped[list[int]] = mapped_column(Json)
    labeled: Mapped[bool] = mapped_column(default=True, server_default=true())
    # y is a 0/1 matrix (N, L): num_classes counts its labels (their names: its `classes`)
    multilabel: Mapped[bool] = mapped_column(default=False, server_default=false())
    label_names: Mapped[list[str] | None] = mapped_column(Json)  # a multi-label set's `classes`


class DatasetLabels(Record, Base):
    """A label revision of a traffic set: every label known after one import, as an (N,)
    int64 .npy (UNLABELLED, -1, where none is known; a multi-label set's label sets (N, L),
    a whole row UNLABELLED) in the artifact store. Revisions count
    from 1; labels are append-only, so each revision holds the one before."""

    __tablename__ = "dataset_labels"
    __table_args__ = (UniqueConstraint("dataset_id", "revision"),)

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    revision: Mapped[int]
    sha256: Mapped[str] = mapped_column(String(64))
    added: Mapped[int]  # samples labelled by this import
    labelled: Mapped[int]  # samples labelled in all
