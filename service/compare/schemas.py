"""Wire schemas of the compare domain: a line's pairwise matrices and pending answers."""

from pydantic import BaseModel


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
