"""Read schema of a job."""

from datetime import datetime
from typing import Any

from service.jobs.models import JobKind, JobState
from service.schemas import RecordRead


class JobRead(RecordRead):
    kind: JobKind
    state: JobState
    progress: float
    params: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    parent_id: int | None
    started_at: datetime | None
    finished_at: datetime | None
