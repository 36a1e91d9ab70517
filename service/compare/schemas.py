"""Wire schemas of the compare domain: a line's pairwise matrices and pending answers."""

from pydantic import BaseModel

from service import urls


class MissingPair(BaseModel):
    """A pair of a matrix whose counts are not stored: the matrix job that stores them, if
    one is open."""

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
    multilabel: bool = False  # per sample: NFR_sample, PFR_sample, churn_sample


class MeasurementQueued(BaseModel):
    """A pair being measured: its metrics job, and every job of `job_ids` (the inference jobs
    it waits for, then itself) to wait for before the report can be read."""

    job_id: int
    status_url: str
    job_ids: list[int]

    @classmethod
    def for_jobs(cls, job_ids: list[int]) -> "MeasurementQueued":
        """The answer for a metrics job, the last of `job_ids`."""
        return cls(job_id=job_ids[-1], status_url=urls.job(job_ids[-1]), job_ids=job_ids)
