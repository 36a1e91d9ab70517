"""Read schema of a data set."""

from service.datasets.models import DatasetRole
from service.schemas import RecordRead


class DatasetRead(RecordRead):
    name: str
    role: DatasetRole
    sha256: str
    n: int
    num_classes: int
    sample_shape: list[int]
