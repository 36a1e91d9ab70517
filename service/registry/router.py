"""Endpoints of model lines and versions."""

import json
from typing import Annotated, Any, NamedTuple
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Response, UploadFile
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, Field, StringConstraints

from service import flows
from service.datasets.service import get_dataset
from service.deps import (
    RAW_BODY_ROUTE,
    READ,
    WRITE,
    CommittingRoute,
    SessionDep,
    SettingsDep,
    StagedModel,
    StoreDep,
)
from service.errors import InvalidInput
from service.registry import service
from service.registry.models import ModelLine, ModelVersion
from service.registry.schemas import (
    ModelLineDetail,
    ModelLineRead,
    ModelVersionRead,
    ScoreKind,
)
from service.storage import StagedFile, upload_name

router = APIRouter(prefix="/models", tags=["models"], route_class=CommittingRoute)
METADATA_MAX_CHARS = 64 * 1024
METADATA_MAX_DEPTH = 32


PARENT_HELP = "line:version or line@alias"
METADATA_HELP = "a JSON object"
OUTPUT_HELP = "the output that holds the scores (default: chosen from the graph)"
SCORES_HELP = "what the scores are (default: detected from the graph)"
MULTILABEL_HELP = ("whether the line's versions score labels apart (one score per label, "
                   "eval sets whose y is a 0/1 matrix); default: the line's kind, single-label "
                   "for a new line")
THRESHOLDS_HELP = ("a multi-label version's decision threshold per label: a JSON list of "
                   "numbers in (0, 1); default: the model's metadata `thresholds`, else 0.5")


@router.post("", status_code=201, response_model=ModelVersionRead, dependencies=[WRITE])
def register_version(
    session: SessionDep, store: StoreDep, settings: SettingsDep,
    name: Annotated[str, Form()], version: Annotated[str, Form()],
    artifact: UploadFile | None = None,
    parent: Annotated[str | None, Form(description=PARENT_HELP)] = None,
    metadata: Annotated[str | None, Form(description=METADATA_HELP)] = None,
    output: Annotated[str | None, Form(description=OUTPUT_HELP)] = None,
    scores: Annotated[ScoreKind | None, Form(description=SCORES_HELP)] = None,
    num_classes: Annotated[int | None, Form(ge=2, description="an external version's new "
                                                 "line: its number of classes")] = None,
    multilabel: Annotated[bool | None, Form(description=MULTILABEL_HELP)] = None,
    thresholds: Annotated[str | None, Form(description=THRESHOLDS_HELP)] = None,
) -> ModelVersion:
    """Register an ONNX classifier as `name:version`: a single `.onnx`, or a `.zip` holding
    one `.onnx` and, flat beside it, the external data files it names. The line is created
    on first use. Inference on the data sets the line was measured on, and metrics against
    the parent and `production`, are queued (see GET /jobs/{id}). Without an `artifact`,
    an external version is registered: its predictions arrive by POST .../predictions.
    With `multilabel` the line is multi-label (docs/server.md, "Multi-label lines")."""
    if artifact is None:
        return service.register_external_version(
            session=session, line_name=name, version=version, num_classes=num_classes,
            parent=parent, metadata=parse_metadata(metadata), multilabel=multilabel,
            thresholds=parse_thresholds(thresholds))
    with store.stage(artifact.file, filename="upload",
                     max_bytes=settings.max_upload_bytes) as staged:
        return register_staged(session, store, settings, staged, name=name, version=version,
                               source=upload_name("artifact", artifact.filename),
                               fields=VersionFields(parent, metadata, output, scores,
                                                    multilabel, thresholds))


@router.put("/{name}/versions/{version}", status_code=201, response_model=ModelVersionRead,
            dependencies=[WRITE], **RAW_BODY_ROUTE)
def put_version(
    name: str, version: str, session: SessionDep, store: StoreDep, settings: SettingsDep,
    body: StagedModel,
    parent: Annotated[str | None, Query(description=PARENT_HELP)] = None,
    metadata: Annotated[str | None, Query(description=METADATA_HELP)] = None,
    output: Annotated[str | None, Query(description=OUTPUT_HELP)] = None,
    scores: Annotated[ScoreKind | None, Query(description=SCORES_HELP)] = None,
    multilabel: Annotated[bool | None, Query(description=MULTILABEL_HELP)] = None,
    thresholds: Annotated[str | None, Query(description=THRESHOLDS_HELP)] = None,
) -> ModelVersion:
    """POST /models with the `.onnx` (or model `.zip`) as the raw request body (Content-Type
    application/octet-stream) and the other fields in the query: streamed to disk and
    hashed in one pass, no form to parse. The same checks, limits and answers as the POST."""
    return register_staged(session, store, settings, body, name=name, version=version,
                           source="artifact",
                           fields=VersionFields(parent, metadata, output, scores, multilabel,
                                                thresholds))


class VersionFields(NamedTuple):
    """What a registration may say beside the model file."""

    parent: str | None
    metadata: str | None
    output: str | None
    scores: str | None
    multilabel: bool | None = None
    thresholds: str | None = None


def register_staged(session: SessionDep, store: StoreDep, settings: SettingsDep,
                    staged: StagedFile, *, name: str, version: str, source: str,
                    fields: VersionFields) -> ModelVersion:
    """Register a staged model file (messages name it `source`) as `name:version` and queue
    what follows."""
    onnx_path = service.model_upload(staged.path, max_bytes=settings.max_decompressed_bytes,
                                     source=source)
    row = service.register_version(session=session, store=store, line_name=name,
                                   version=version, onnx_path=onnx_path, parent=fields.parent,
                                   metadata=parse_metadata(fields.metadata), source=source,
                                   output=fields.output, scores=fields.scores,
                                   multilabel=fields.multilabel,
                                   thresholds=parse_thresholds(fields.thresholds))
    flows.version_registered(session=session, version=row)
    return row


def parse_metadata(text: str | None) -> dict[str, Any] | None:
    """The `metadata` form field, which must hold a JSON object of at most METADATA_MAX_CHARS
    characters, nested at most METADATA_MAX_DEPTH deep, without NaN, infinities or NULs."""
    if text is None:
        return None
    if len(text) > METADATA_MAX_CHARS:
        raise InvalidInput("invalid_metadata", f"metadata is longer than {METADATA_MAX_CHARS} "
                           "characters")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, RecursionError, ValueError) as error:
        raise InvalidInput("invalid_metadata", f"metadata is not plain JSON: {error}") from error
    if not isinstance(value, dict):
        raise InvalidInput("invalid_metadata", "metadata must be a JSON object")
    _check_metadata_value(value, depth=1)
    return value


def parse_thresholds(text: str | None) -> list[float] | None:
    """The `thresholds` field: a JSON list (its numbers are checked against the line's
    labels by the registry)."""
    if text is None:
        return None
    if len(text) > METADATA_MAX_CHARS:
        raise InvalidInput("invalid_thresholds", f"thresholds are longer than "
                           f"{METADATA_MAX_CHARS} characters")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, RecursionError, ValueError) as error:
        raise InvalidInput("invalid_thresholds", f"thresholds are not a JSON list: {error}"
                           ) from error
    if not isinstance(value, list):
        raise InvalidInput("invalid_thresholds", "thresholds must be a JSON list of numbers "
                           "in (0, 1), one per label")
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _check_metadata_value(value: Any, depth: int) -> None:
    """Nested at most METADATA_MAX_DEPTH deep; no NUL character in any key or string."""
    if depth > METADATA_MAX_DEPTH:
        raise InvalidInput("invalid_metadata", f"metadata is nested deeper than "
                           f"{METADATA_MAX_DEPTH} levels")
    if not isinstance(value, dict | list):
        return
    children = list(value.values()) if isinstance(value, dict) else value
    strings = [*(value if isinstance(value, dict) else []),
               *(child for child in children if isinstance(child, str))]
    if any("\0" in string for string in strings):
        raise InvalidInput("invalid_metadata", "metadata may not contain NUL characters")
    for child in children:
        _check_metadata_value(child, depth + 1)


@router.get("", response_model=list[ModelLineRead], dependencies=[READ])
def list_lines(session: SessionDep) -> list[ModelLine]:
    """Every model line."""
    return service.list_lines(session=session)


@router.get("/{name}", response_model=ModelLineDetail, dependencies=[READ])
def read_line(name: str, session: SessionDep) -> ModelLineDetail:
    """A model line with its versions and aliases."""
    return ModelLineDetail.model_validate({
        "line": service.get_line(session=session, name=name),
        "versions": service.list_versions(session=session, line_name=name),
        "aliases": service.list_aliases(session=session, line_name=name),
    }, from_attributes=True)


@router.get("/{name}/versions/{version}", response_model=ModelVersionRead, dependencies=[READ])
def read_version(name: str, version: str, session: SessionDep) -> ModelVersion:
    """One version of a line."""
    return service.get_named_version(session=session, line_name=name, version=version)


ARTIFACT_RESPONSES: dict[int | str, dict[str, Any]] = {200: {
    "description": "the .onnx file (application/octet-stream), or for a model with external "
    "data its bundle: an uncompressed tar of model.onnx and its data files in name order "
    "(application/x-tar); X-Flipgate-Sha256 is the version's artifact_sha256",
    "content": {"application/octet-stream": {}, "application/x-tar": {}}}}


@router.get("/{name}/versions/{version}/artifact", response_class=Response,
            responses=ARTIFACT_RESPONSES, dependencies=[READ])
def download_model(name: str, version: str, session: SessionDep, store: StoreDep) -> Response:
    """The exact model a version registered (and a gate measured), streamed from the artifact
    store (through the server's cache when the store is a bucket), for a deploy job; an
    external version has none (404 `version_has_no_model`)."""
    row = service.get_named_version(session=session, line_name=name, version=version)
    sha256 = service.model_address(row)
    headers = {"X-Flipgate-Sha256": sha256, "ETag": f'"{sha256}"'}
    if store.is_bundle(sha256):
        disposition = f"attachment; filename*=utf-8''{quote(f'{name}-{version}.tar')}"
        return StreamingResponse(store.bundle_tar(sha256), media_type="application/x-tar",
                                 headers={**headers, "Content-Disposition": disposition})
    return FileResponse(store.local_path(sha256), media_type="application/octet-stream",
                        headers=headers, filename=f"{name}-{version}.onnx")


class TrainingDatasetChoice(BaseModel):
    dataset: str


@router.put("/{name}/training-dataset", response_model=ModelLineRead, dependencies=[WRITE])
def set_training_dataset(name: str, body: TrainingDatasetChoice,
                         session: SessionDep) -> ModelLine:
    """Choose the training set (POST /trainsets) that repairs of the line's candidates use."""
    return service.set_training_dataset(session=session, line_name=name,
                                        dataset=get_dataset(session=session, name=body.dataset))


class ClassNames(BaseModel):
    class_names: list[Annotated[str, StringConstraints(max_length=256)]] = Field(
        max_length=1 << 20)


@router.put("/{name}/classes", response_model=ModelLineRead, dependencies=[WRITE])
def set_class_names(name: str, body: ClassNames, session: SessionDep) -> ModelLine:
    """Name the line's classes (one unique name per output column), shown in its reports,
    the gate's reasons and the dashboard."""
    return service.set_class_names(session=session, line_name=name,
                                   class_names=body.class_names)
