"""Endpoints of background jobs."""

from fastapi import APIRouter

from service import flows
from service.deps import READ, WRITE, CommittingRoute, SessionDep, SettingsDep
from service.jobs import service
from service.jobs.models import Job
from service.jobs.schemas import JobRead

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=CommittingRoute)


@router.get("/{job_id}", response_model=JobRead, dependencies=[READ])
def read_job(job_id: int, session: SessionDep) -> Job:
    """A job's state, progress (0..1), error and result."""
    return service.get_job(session=session, job_id=job_id)


@router.post("/{job_id}/cancel", response_model=JobRead, dependencies=[WRITE])
def cancel_job(job_id: int, session: SessionDep, settings: SettingsDep) -> Job:
    """Cancel a queued or running job (409 when it has already finished); gate decisions
    that waited for it are blocked."""
    return flows.cancel_job(session=session, settings=settings, job_id=job_id)
