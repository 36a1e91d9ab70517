"""Endpoint for the scores or labels that a team computed itself."""

from typing import Annotated

from fastapi import APIRouter, Form, Query, UploadFile
from sqlalchemy.orm import Session

from flipgate.scores import PROBABILITIES
from service import flows
from service.datasets.models import Dataset
from service.datasets.service import get_dataset
from service.deps import (
    RAW_BODY_ROUTE,
    WRITE,
    CommittingRoute,
    SessionDep,
    SettingsDep,
    StagedLogits,
    StoreDep,
)
from service.errors import InvalidInput
from service.names import NAME_LENGTH
from service.predictions import service
from service.predictions.models import Prediction, PredictionSource
from service.predictions.schemas import PredictionRead
from service.registry.models import ModelLine, ModelVersion
from service.registry.schemas import ScoreKind
from service.registry.service import get_named_version
from service.storage import ArtifactStore, StagedFile, upload_name

router = APIRouter(tags=["predictions"], route_class=CommittingRoute)


@router.post("/models/{name}/versions/{version}/predictions", status_code=201,
             response_model=PredictionRead, dependencies=[WRITE])
def upload_predictions(name: str, version: str, session: SessionDep, store: StoreDep,
                       settings: SettingsDep, evalset: Annotated[str, Form()],
                       logits: UploadFile | None = None,
                       labels: UploadFile | None = None,
                       scores: Annotated[ScoreKind, Form(description="what the uploaded "
                                                         "scores are")] = "logits",
                       ) -> Prediction:
    """Store the (N, C) float `logits` (.npy) of `name:version` on an eval set
    (probabilities with `scores=probabilities`, kept as their logs: flipgate.scores), or its
    predicted `labels` (.npy of shape (N,): integers, or class names when the line has
    them); metrics against its parent and `production` are queued where they have
    predictions on it too. A multi-label line's version sends float scores (N, L) (logits,
    or `scores=probabilities`) or 0/1 decisions (N, L) on a multi-label set of its shape."""
    row = get_named_version(session=session, line_name=name, version=version)
    dataset = get_dataset(session=session, name=evalset)
    if (logits is None) == (labels is None):
        raise InvalidInput("predictions_file", "send exactly one of the files `logits` and "
                           "`labels`")
    upload = labels or logits
    with store.stage(upload.file, filename="predictions.npy",
                     max_bytes=settings.max_upload_bytes) as staged:
        if dataset.multilabel or session.get_one(ModelLine, row.line_id).multilabel:
            prediction = service.store_label_predictions(
                session=session, store=store, version=row, dataset=dataset,
                npy_path=staged.path, scores=scores,
                name=upload_name("labels" if labels else "logits", upload.filename))
        elif labels is not None:
            prediction = service.store_labels_file(
                session=session, store=store, version=row, dataset=dataset,
                npy_path=staged.path, name=upload_name("labels", labels.filename))
        else:
            prediction = _store_scores(session, store, row, dataset, staged, scores,
                                       upload_name("logits", logits.filename))
    flows.logits_stored(session=session, version=row, dataset=dataset)
    return prediction


@router.put("/models/{name}/versions/{version}/predictions", status_code=201,
            response_model=PredictionRead, dependencies=[WRITE], **RAW_BODY_ROUTE)
def put_predictions(name: str, version: str, session: SessionDep, store: StoreDep,
                    body: StagedLogits, evalset: Annotated[str, Query(max_length=NAME_LENGTH)],
                    scores: Annotated[ScoreKind, Query(description="what the uploaded scores "
                                                       "are")] = "logits") -> Prediction:
    """The POST's logits upload with the .npy file as the raw request body (Content-Type
    application/octet-stream): streamed to disk in one pass, no form to parse. The same
    checks, limits and answers as the POST."""
    row = get_named_version(session=session, line_name=name, version=version)
    dataset = get_dataset(session=session, name=evalset)
    if dataset.multilabel or session.get_one(ModelLine, row.line_id).multilabel:
        raise InvalidInput("multilabel_upload_needs_post", "a multi-label version's scores "
                           "are uploaded with the POST (multipart file `logits` or `labels`)")
    prediction = _store_scores(session, store, row, dataset, body, scores, "logits")
    flows.logits_stored(session=session, version=row, dataset=dataset)
    return prediction


def _store_scores(session: Session, store: ArtifactStore, version: ModelVersion,
                  dataset: Dataset, staged: StagedFile, scores: str, shown: str) -> Prediction:
    """Store an uploaded scores file as the version's logits (probabilities as their logs)."""
    if staged.path is None:  # streamed into the store: checked from its scan
        checked = service.check_streamed_logits(version=version, dataset=dataset,
                                                staged=staged, name=shown)
    else:
        path, sha256, scan = staged.path, staged.sha256, staged.scan
        if scores == PROBABILITIES:
            path, sha256, scan = service.logits_of_probabilities(path, name=shown), None, None
        checked = service.check_logits_file(version=version, dataset=dataset, npy_path=path,
                                            name=shown, sha256=sha256, scan=scan)
    return service.store_logits_file(session=session, store=store, version=version,
                                     dataset=dataset, logits=checked,
                                     source=PredictionSource.UPLOADED)
