"""Read schema of stored predictions."""

from service.predictions.models import PredictionSource
from service.schemas import RecordRead


class PredictionRead(RecordRead):
    version_id: int
    dataset_id: int
    logits_sha256: str | None  # None when only predicted labels were uploaded
    source: PredictionSource
    provider: str | None
    classes_sha256: str | None  # its predicted classes (.npy, smallest integer dtype)
