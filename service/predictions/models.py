"""ORM model of stored predictions."""

from enum import StrEnum

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.datasets.models import Dataset
from service.db import Base, Record, str_enum
from service.registry.models import ModelVersion


class PredictionSource(StrEnum):
    COMPUTED = "computed"
    UPLOADED = "uploaded"


class Prediction(Record, Base):
    """The (N, C) logits of one version on one data set, kept as a .npy artifact, and its
    predicted classes beside them; or (an uploaded labels-only row) its predicted classes
    alone. On a multi-label set: its probabilities (N, L) float64 in place of the logits,
    and its 0/1 decisions (N, L) in place of the classes."""

    __tablename__ = "predictions"
    __table_args__ = (UniqueConstraint("version_id", "dataset_id"),)

    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    logits_sha256: Mapped[str | None] = mapped_column(String(64))  # None: labels only
    # the argmax of the logits in the smallest integer dtype (.npy); None on rows stored
    # before it existed, until a metrics job reads them
    classes_sha256: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[PredictionSource] = mapped_column(str_enum(PredictionSource,
                                                              "prediction_source"))
    provider: Mapped[str | None] = mapped_column(String(64))

    version: Mapped[ModelVersion] = relationship(lazy="raise")
    dataset: Mapped[Dataset] = relationship(lazy="raise")
