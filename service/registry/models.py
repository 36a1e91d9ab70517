"""ORM models of model lines, versions and aliases."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    ForeignKey,
    ForeignKeyConstraint,
    String,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.db import Base, Json, Record, utcnow
from service.names import NAME_LENGTH
from service.projects.models import ProjectOwned


class ModelLine(ProjectOwned, Record, Base):
    """A sequence of classifier versions that solve one task with one set of classes; a
    multi-label line's versions decide each of its `num_classes` labels (named
    `class_names`) apart, from one score per label."""

    __tablename__ = "model_lines"
    __table_args__ = (CheckConstraint("num_classes >= 2", name="num_classes"),
                      UniqueConstraint("project_id", "name"),
                      UniqueConstraint("id", "project_id"))  # what a version's key points at

    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    num_classes: Mapped[int]
    class_names: Mapped[list[str] | None] = mapped_column(Json)
    training_dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id"))
    multilabel: Mapped[bool] = mapped_column(default=False, server_default=false())


class ModelVersion(ProjectOwned, Record, Base):
    """One classifier of a line: an ONNX file, with the interface read from it, or an external
    version (no artifact, no inputs) whose predictions are uploaded.

    Its project is its line's: the foreign key (line_id, project_id) points at the line's
    (id, project_id), so no row can hold another, and `line` copies both when it is set, so
    the project is filled in wherever a version is made. A session bound to another
    project does not see the version, even by its id (service.projects.scoping)."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("line_id", "version"),
                      CheckConstraint("num_classes >= 2", name="num_classes"),
                      ForeignKeyConstraint(["line_id", "project_id"],
                                           ["model_lines.id", "model_lines.project_id"]))

    line_id: Mapped[int]
    version: Mapped[str] = mapped_column(String(NAME_LENGTH))
    artifact_sha256: Mapped[str | None] = mapped_column(String(64))
    input_name: Mapped[str | None] = mapped_column(String(256))
    input_shape: Mapped[list[int | None] | None] = mapped_column(Json)
    inputs: Mapped[list[dict[str, Any]] | None] = mapped_column(Json)  # InputSpec.as_json
    num_classes: Mapped[int]
    scores_output: Mapped[str | None] = mapped_column(String(256))  # None: the only output
    scores_kind: Mapped[str | None] = mapped_column(String(16))  # logits | probabilities
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    produced_by: Mapped[dict[str, Any] | None]
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    # a multi-label version's decision threshold per label (None: 0.5 for every label)
    thresholds: Mapped[list[float] | None] = mapped_column(Json)

    line: Mapped[ModelLine] = relationship(lazy="raise")
    parent: Mapped["ModelVersion | None"] = relationship(remote_side="ModelVersion.id",
                                                         lazy="raise")

    @property
    def external(self) -> bool:
        """Registered without a model file: its predictions can only be uploaded."""
        return self.artifact_sha256 is None


class Alias(Record, Base):
    """A movable name (e.g. `production`) for one version of a line."""

    __tablename__ = "model_aliases"
    __table_args__ = (UniqueConstraint("line_id", "name"),)

    line_id: Mapped[int] = mapped_column(ForeignKey("model_lines.id"))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    version: Mapped[ModelVersion] = relationship(lazy="raise")
