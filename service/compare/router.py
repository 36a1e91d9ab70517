"""Endpoints of pair reports and a line's pairwise matrices. A GET answers from stored rows;
a POST queues the metrics jobs (service.compare.service) or the matrix job
(service.compare.matrix) that store what is missing."""

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.orm import Session

from service.compare import matrix as matrices
from service.compare import service
from service.compare.schemas import MeasurementQueued, PairMatrix
from service.datasets.service import get_dataset
from service.deps import READ, CommittingRoute, SessionDep, StoreDep
from service.errors import NotFound
from service.jobs.models import Job
from service.jobs.service import dependencies

router = APIRouter(tags=["compare"], route_class=CommittingRoute)
QUEUED = {202: {"description": "the pair is being measured: the jobs to wait for",
                "model": MeasurementQueued}}
REPORT = {200: {"description": "the keys of `flipgate compare --json`, or the HTML report",
                "content": {"application/json": {}, "text/html": {}}}}
PARTIAL = {202: {"description": "pairs are missing; `missing` lists them with the matrix job",
                 "model": PairMatrix}}


@router.get("/compare/{old}/{new}", response_class=Response, dependencies=[READ],
            responses={**REPORT, **QUEUED, 404: {"description": "not measured (not_measured)"}})
def compare(
    old: str, new: str, evalset: str, session: SessionDep, store: StoreDep,
    report_format: Annotated[Literal["json", "html"], Query(alias="format")] = "json",
) -> Response:
    """The stored report of two versions ("line:version" or "line@alias") on an eval set;
    202 with the metrics job while it is queued or running; 404 `not_measured` when nothing
    measures the pair (POST to this address queues it)."""
    pair = service.resolve_pair(session=session, old=old, new=new, evalset=evalset)
    report = service.stored_report(session=session, pair=pair)
    if report is None:
        job = service.open_measurement(session=session, pair=pair)
        if job is None:
            raise NotFound("not_measured", f"{old} → {new} is not measured on {evalset!r}; "
                           f"POST /compare/{old}/{new}?evalset={evalset} measures it")
        return queued(session, job)
    if report_format == "html":
        return HTMLResponse(service.stored_html(session=session, store=store, pair=pair))
    return JSONResponse(report)




@router.get("/compare/{old}/{new}/disagreements", response_class=Response, dependencies=[READ],
            responses={**QUEUED, 200: {"description": "the export (JSON, CSV or Label Studio "
                                       "tasks)", "content": {"application/json": {},
                                                             "text/csv": {}}},
                       404: {"description": "not measured (not_measured)"}})
def disagreements(
    old: str, new: str, evalset: str, session: SessionDep, store: StoreDep,
    export_format: Annotated[Literal["json", "csv", "label-studio"],
                             Query(alias="format")] = "json",
) -> Response:
    """Every sample of a traffic set on which the two versions' predicted classes differ, in
    the documented random order (docs/traffic.md) that `flipgate compare --disagreements`
    computes alike: index, id, both predictions and confidences, and the text or picture;
    as stored by the pair's metrics job (202 while it runs, 404 when nothing measures it)."""
    pair = service.resolve_pair(session=session, old=old, new=new, evalset=evalset)
    exported = service.stored_export(session=session, store=store, pair=pair,
                                     export_format=export_format)
    if exported is None:
        return compare(old, new, evalset, session, store)
    return Response(exported, media_type=service.EXPORT_TYPES[export_format])


@router.post("/compare/{old}/{new}", response_class=Response, dependencies=[READ],
             responses={**QUEUED, 200: {"description": "the stored report (JSON)"}})
def measure(old: str, new: str, evalset: str, session: SessionDep) -> Response:
    """Measure two versions on an eval set: 202 with the metrics job and the inference jobs
    it waits for (asking again returns the same open jobs), or 200 with the report when it
    is stored. The jobs are sent to the workers (`flipgate worker`, or the one `flipgate
    serve` starts) once this request commits."""
    pair = service.resolve_pair(session=session, old=old, new=new, evalset=evalset)
    report = service.stored_report(session=session, pair=pair)
    if report is not None:
        return JSONResponse(report)
    service.check_scorable(session=session, pair=pair)
    return queued(session, service.queue_measurement(session=session, pair=pair)[-1])


def queued(session: Session, job: Job) -> JSONResponse:
    """202 with a metrics job and the jobs it waits for."""
    job_ids = [other.id for other in dependencies(session=session, job=job)] + [job.id]
    return JSONResponse(MeasurementQueued.for_jobs(job_ids).model_dump(), status_code=202)


@router.get("/models/{name}/matrix", response_model=PairMatrix, dependencies=[READ])
def matrix(name: str, evalset: str, session: SessionDep) -> PairMatrix:
    """NFR, PFR and churn of every ordered pair of the line's versions that have logits on
    the eval set, from the stored pair counts; [i][j] is version i replaced by version j. The
    pairs not stored are listed in `missing` with the open matrix job (POST to this address
    queues it)."""
    return matrices.line_matrix(session=session, line_name=name,
                                dataset=get_dataset(session=session, name=evalset))


@router.post("/models/{name}/matrix", response_model=PairMatrix, dependencies=[READ],
             responses=PARTIAL)
def measure_matrix(name: str, evalset: str, session: SessionDep) -> JSONResponse:
    """Queue the matrix job that stores the counts of every pair not stored yet (the open one
    is kept: asking twice gives the same job); 202 with the partial matrix and its missing
    pairs' job, or 200 when it is complete."""
    dataset = get_dataset(session=session, name=evalset)
    matrices.queue_matrix(session=session, line_name=name, dataset=dataset)
    answer = matrices.line_matrix(session=session, line_name=name, dataset=dataset)
    return JSONResponse(answer.model_dump(), status_code=202 if answer.missing else 200)
