"""Endpoint for logits that a team computed itself."""

from typing import Annotated

from fastapi import APIRouter, Form, UploadFile

from flipgate.scores import PROBABILITIES
from service import flows
from service.artifacts import upload_name
from service.datasets.service import get_dataset
from service.deps import WRITE, SessionDep, SettingsDep, StoreDep
from service.predictions import service
from service.predictions.models import Prediction, PredictionSource
from service.predictions.schemas import PredictionRead
from service.registry.schemas import ScoreKind
from service.registry.service import find_version

router = APIRouter(tags=["predictions"])


@router.post("/models/{name}/versions/{version}/predictions", status_code=201,
             response_model=PredictionRead, dependencies=[WRITE])
def upload_predictions(name: str, version: str, session: SessionDep, store: StoreDep,
                       settings: SettingsDep, evalset: Annotated[str, Form()],
                       logits: UploadFile,
                       scores: Annotated[ScoreKind, Form(description="what the uploaded "
                                                         "scores are")] = "logits",
                       ) -> Prediction:
    """Store the (N, C) float logits (.npy) of `name:version` on an eval set (probabilities
    with `scores=probabilities`, kept as their logs: flipgate.scores); metrics against its
    parent and `production` are queued where they have logits on it too."""
    row = find_version(session=session, line_name=name, version=version)
    dataset = get_dataset(session=session, name=evalset)
    shown = upload_name("logits", logits.filename)
    with store.stage(logits.file, filename="logits.npy",
                     max_bytes=settings.max_upload_bytes) as path:
        if scores == PROBABILITIES:
            path = service.logits_of_probabilities(path, name=shown)
        checked = service.check_logits_file(version=row, dataset=dataset, npy_path=path,
                                            name=shown)
        prediction = service.store_logits_file(
            session=session, store=store, version=row, dataset=dataset, logits=checked,
            source=PredictionSource.UPLOADED)
    flows.logits_stored(session=session, version=row, dataset=dataset)
    return prediction
