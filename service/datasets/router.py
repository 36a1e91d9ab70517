"""Endpoints of eval sets."""

from typing import Annotated

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import JSONResponse

from service import flows
from service.datasets import service
from service.datasets.labels import latest_labels
from service.datasets.models import Dataset, DatasetRole
from service.datasets.schemas import DatasetRead, LabelsAdded
from service.deps import (
    RAW_BODY_ROUTE,
    READ,
    WRITE,
    CommittingRoute,
    SessionDep,
    SettingsDep,
    StagedNpz,
    StoreDep,
)
from service.storage import StagedFile, upload_name

router = APIRouter(tags=["evalsets"], route_class=CommittingRoute)


TRAFFIC_MULTILABEL_HELP = ("a traffic set (no y) of multi-label lines: their versions' "
                           "decisions per label are compared on it and it takes label sets")


@router.post("/evalsets", status_code=201, response_model=DatasetRead, dependencies=[WRITE])
def register_evalset(session: SessionDep, store: StoreDep, settings: SettingsDep,
                     name: Annotated[str, Form()], data: UploadFile,
                     multilabel: Annotated[bool, Form(description=TRAFFIC_MULTILABEL_HELP)]
                     = False) -> Dataset:
    """Register an eval set: an .npz with arrays x (float, N first) and y (labels; a traffic
    set has none, and `multilabel` makes it one of multi-label lines)."""
    return register(session, store, settings, name, data, DatasetRole.EVAL,
                    multilabel=multilabel)


@router.post("/trainsets", status_code=201, response_model=DatasetRead, dependencies=[WRITE])
def register_trainset(session: SessionDep, store: StoreDep, settings: SettingsDep,
                      name: Annotated[str, Form()], data: UploadFile) -> Dataset:
    """Register a labeled training set (the eval-set format) for repairs of blocked
    candidates; PUT /models/{name}/training-dataset makes it a line's."""
    return register(session, store, settings, name, data, DatasetRole.TRAIN)


@router.put("/evalsets/{name}", status_code=201, response_model=DatasetRead,
            dependencies=[WRITE], **RAW_BODY_ROUTE)
def put_evalset(name: str, session: SessionDep, store: StoreDep, settings: SettingsDep,
                body: StagedNpz,
                multilabel: Annotated[bool, Query(description=TRAFFIC_MULTILABEL_HELP)] = False,
                ) -> Dataset:
    """POST /evalsets with the .npz as the raw request body (Content-Type
    application/octet-stream): streamed to disk and hashed in one pass, no form to parse.
    The same checks, limits and answers as the POST."""
    return store_staged(session, store, settings, name, body, "data", DatasetRole.EVAL,
                        multilabel=multilabel)


def register(session: SessionDep, store: StoreDep, settings: SettingsDep, name: str,
             data: UploadFile, role: DatasetRole, *, multilabel: bool = False) -> Dataset:
    """Stage the upload under the size limit and store it as a data set of `role`."""
    with store.stage(data.file, filename="data.npz", max_bytes=settings.max_upload_bytes) as staged:
        return store_staged(session, store, settings, name, staged,
                            upload_name("data", data.filename), role, multilabel=multilabel)


def store_staged(session: SessionDep, store: StoreDep, settings: SettingsDep, name: str,
                 staged: StagedFile, source: str, role: DatasetRole, *,
                 multilabel: bool = False) -> Dataset:
    """Store a staged .npz (messages name it `source`) as the data set `name` of `role`."""
    return service.register_dataset(
        session=session, store=store, name=name, role=role, npz_path=staged.path,
        sha256=staged.sha256, source=source, multilabel=multilabel,
        max_decompressed_bytes=settings.max_decompressed_bytes)


@router.get("/evalsets", response_model=list[DatasetRead], dependencies=[READ])
def list_evalsets(session: SessionDep) -> list[Dataset]:
    """Every eval set."""
    return service.list_datasets(session=session, role=DatasetRole.EVAL)


@router.get("/trainsets", response_model=list[DatasetRead], dependencies=[READ])
def list_trainsets(session: SessionDep) -> list[Dataset]:
    """Every training set."""
    return service.list_datasets(session=session, role=DatasetRole.TRAIN)


@router.post("/evalsets/{name}/labels", status_code=201, response_model=LabelsAdded,
             dependencies=[WRITE],
             responses={200: {"description": "every label was known already: nothing new",
                              "model": LabelsAdded},
                        409: {"description": "a sample has another label (label_conflict)"}})
def import_labels(name: str, session: SessionDep, store: StoreDep, settings: SettingsDep,
                  labels: UploadFile) -> JSONResponse:
    """Add labels to a traffic set (multipart file `labels`: an .npz of `index` or `ids`
    and `y`, or a Label Studio JSON export): a new label revision, and the metrics jobs
    that measure its pairs again with it. Append-only: a different label for a labelled
    sample is refused (409, naming it); the same labels again answer 200 and change nothing."""
    dataset = service.get_dataset_of_role(session=session, name=name, role=DatasetRole.EVAL)
    with store.stage(labels.file, filename="labels",
                     max_bytes=settings.max_upload_bytes) as staged:
        revision, jobs = flows.labels_posted(session=session, store=store, dataset=dataset,
                                             labels_path=staged.path,
                                             source=upload_name("labels", labels.filename))
    if revision is None:
        current = latest_labels(session=session, dataset=dataset)
        return JSONResponse(LabelsAdded.of(current, [], new=False).model_dump(mode="json"))
    return JSONResponse(LabelsAdded.of(revision, [job.id for job in jobs], new=True).model_dump(
        mode="json"), status_code=201)
