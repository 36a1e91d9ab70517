"""Read schemas of model lines, versions and aliases."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.schemas import RecordRead

ScoreKind = Literal["logits", "probabilities"]  # what a model's scores are (flipgate.scores)


class ModelLineRead(RecordRead):
    name: str
    num_classes: int
    class_names: list[str] | None
    training_dataset_id: int | None
    multilabel: bool = False  # its versions score each of num_classes labels apart


class ModelVersionRead(RecordRead):
    line_id: int
    version: str
    artifact_sha256: str | None  # None for an external version
    input_name: str | None
    input_shape: list[int | None] | None
    inputs: list[dict[str, Any]] | None  # each input's name, dtype and shape (N: None)
    external: bool
    num_classes: int
    scores_output: str | None
    scores_kind: str | None
    parent_id: int | None
    produced_by: dict[str, Any] | None
    thresholds: list[float] | None = None  # a multi-label version's, per label (None: 0.5)
    metadata: dict[str, Any] = Field(validation_alias="meta")


class AliasRead(RecordRead):
    line_id: int
    name: str
    version_id: int
    updated_at: datetime


class ModelLineDetail(BaseModel):
    """A line with its versions (oldest first) and its aliases."""

    line: ModelLineRead
    versions: list[ModelVersionRead]
    aliases: list[AliasRead]
