"""Endpoint for logits that a team computed itself."""

from typing import Annotated

from fastapi import APIRouter, Form, UploadFile

from service import flows
from service.artifacts import upload_name
from service.datasets.service import get_dataset
from service.deps import WRITE, SessionDep, SettingsDep, StoreDep
from service.errors import InvalidInput
from service.predictions import service
from service.predictions.models import Prediction, PredictionSource
from service.predictions.schemas import PredictionRead
from service.registry.service import find_version

router = APIRouter(tags=["predictions"])


@router.post("/models/{name}/versions/{version}/predictions", status_code=201,
             response_model=PredictionRead, dependencies=[WRITE])
def upload_predictions(name: str, version: str, session: SessionDep, store: StoreDep,
                       settings: SettingsDep, evalset: Annotated[str, Form()],
                       logits: UploadFile | None = None,
                       labels: UploadFile | None = None) -> Prediction:
    """Store the (N, C) float `logits` (.npy) of `name:version` on an eval set, or its
    predicted `labels` (.npy of shape (N,): integers, or class names when the line has
    them); metrics against its parent and `production` are queued where they have
    predictions on it too."""
    row = find_version(session=session, line_name=name, version=version)
    dataset = get_dataset(session=session, name=evalset)
    if (logits is None) == (labels is None):
        raise InvalidInput("predictions_file", "send exactly one of the files `logits` and "
                           "`labels`")
    if labels is not None:
        with store.stage(labels.file, filename="labels.npy",
                         max_bytes=settings.max_upload_bytes) as path:
            prediction = service.store_labels_file(
                session=session, store=store, version=row, dataset=dataset, npy_path=path,
                name=upload_name("labels", labels.filename))
        flows.logits_stored(session=session, version=row, dataset=dataset)
        return prediction
    with store.stage(logits.file, filename="logits.npy",
                     max_bytes=settings.max_upload_bytes) as path:
        checked = service.check_logits_file(version=row, dataset=dataset, npy_path=path,
                                            name=upload_name("logits", logits.filename))
        prediction = service.store_logits_file(
            session=session, store=store, version=row, dataset=dataset, logits=checked,
            source=PredictionSource.UPLOADED)
    flows.logits_stored(session=session, version=row, dataset=dataset)
    return prediction
