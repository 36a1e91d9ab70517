"""Read schemas of pair metrics and of a line's pairwise matrices."""

from typing import Any

from pydantic import BaseModel

from service.schemas import RecordRead


class PairMetricsRead(RecordRead):
    """The ids of the triple and the full compare report (every column's value is in it)."""

    old_version_id: int
    new_version_id: int
    dataset_id: int
    report: dict[str, Any]


class PairMatrix(BaseModel):
    """Entry [i][j] compares version i (old) with version j (new); None where not computed."""

    versions: list[str]
    nfr: list[list[float | None]]
    pfr: list[list[float | None]]
    churn: list[list[float | None]]


class PredictionsPending(BaseModel):
    """Answer to a compare whose predictions are missing: the inference jobs to wait for."""

    job_id: int
    status_url: str
    job_ids: list[int]

    @classmethod
    def for_jobs(cls, job_ids: list[int]) -> "PredictionsPending":
        return cls(job_id=job_ids[0], status_url=f"/jobs/{job_ids[0]}", job_ids=job_ids)
