"""Endpoints of eval sets."""

from typing import Annotated

from fastapi import APIRouter, Form, UploadFile

from service.deps import READ, WRITE, SessionDep, SettingsDep, StoreDep
from service.evalsets import service
from service.evalsets.models import Dataset, DatasetRole
from service.evalsets.schemas import DatasetRead

router = APIRouter(prefix="/evalsets", tags=["evalsets"])


@router.post("", status_code=201, response_model=DatasetRead, dependencies=[WRITE])
def register_evalset(session: SessionDep, store: StoreDep, settings: SettingsDep,
                     name: Annotated[str, Form()], data: UploadFile) -> Dataset:
    """Register a labeled eval set: an .npz with arrays x (float, N first) and y (labels)."""
    with store.stage(data.file, filename="data.npz", max_bytes=settings.max_upload_bytes) as path:
        return service.register_dataset(session=session, store=store, name=name,
                                        role=DatasetRole.EVAL, npz_path=path)


@router.get("", response_model=list[DatasetRead], dependencies=[READ])
def list_evalsets(session: SessionDep) -> list[Dataset]:
    """Every eval set."""
    return service.list_datasets(session=session, role=DatasetRole.EVAL)
