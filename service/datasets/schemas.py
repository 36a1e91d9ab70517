"""Read schema of a data set."""

from pydantic import BaseModel

from service.datasets.models import DatasetLabels, DatasetRole
from service.schemas import RecordRead


class DatasetRead(RecordRead):
    name: str
    role: DatasetRole
    sha256: str
    n: int
    num_classes: int | None  # None: a traffic set without `classes` (the models' count)
    sample_shape: list[int]
    labeled: bool  # false: a traffic set (no `y`; labels added later, docs/traffic.md)
    multilabel: bool = False  # y is a 0/1 matrix (N, L): num_classes is L
    label_names: list[str] | None = None  # a multi-label set's names of its labels


class LabelsAdded(BaseModel):
    """What a label import made: the traffic set's label revision (None: still no labels),
    how many samples it labelled and are labelled in all, and the metrics jobs that measure
    the set's pairs again with it."""

    revision: int | None
    added: int
    labelled: int
    job_ids: list[int]

    @classmethod
    def of(cls, labels: DatasetLabels | None, job_ids: list[int], *, new: bool) -> "LabelsAdded":
        """The answer naming the revision `labels` (made by this import when `new`)."""
        return cls(revision=labels and labels.revision, added=labels.added if new else 0,
                   labelled=labels.labelled if labels else 0, job_ids=job_ids)
