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


class MissingPair(BaseModel):
    """A pair of a matrix whose metrics are not stored: its metrics job, if one is open."""

    old: str
    new: str
    job_id: int | None


class PairMatrix(BaseModel):
    """Entry [i][j] compares version i (old) with version j (new); None where not stored (the
    pair is listed in `missing`)."""

    versions: list[str]
    nfr: list[list[float | None]]
    pfr: list[list[float | None]]
    churn: list[list[float | None]]
    missing: list[MissingPair] = []


class MeasurementQueued(BaseModel):
    """A pair being measured: its metrics job, and every job of `job_ids` (the inference jobs
    it waits for, then itself) to wait for before the report can be read."""

    job_id: int
    status_url: str
    job_ids: list[int]

    @classmethod
    def for_jobs(cls, job_ids: list[int]) -> "MeasurementQueued":
        """The answer for a metrics job, the last of `job_ids`."""
        return cls(job_id=job_ids[-1], status_url=f"/jobs/{job_ids[-1]}", job_ids=job_ids)
