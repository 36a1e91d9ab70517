"""Wire schemas of the MLflow connector."""

from service.schemas import RecordRead


class MlflowEventRead(RecordRead):
    delivery_id: str | None
    model: str
    alias: str
    version: str
    action: str
    decision_id: int | None
    message: str
