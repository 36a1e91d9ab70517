"""The base class of the read schemas that every domain's schemas.py builds on."""

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class RecordRead(BaseModel):
    """A schema read straight from an ORM object, with the columns every table has."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime


class ErrorDetail(BaseModel):
    """What went wrong: a machine-readable code and a message for people."""

    code: str
    message: str


class ErrorBody(BaseModel):
    """The body of every refusal (4xx) and of an unavailable database (503)."""

    error: ErrorDetail
