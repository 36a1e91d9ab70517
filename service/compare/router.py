"""Endpoints of pair reports and a line's pairwise matrices."""

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response

from service.compare import service
from service.compare.schemas import PairMatrix, PredictionsPending
from service.datasets.service import get_dataset
from service.deps import READ, SessionDep, StoreDep
from service.predictions.service import queue_missing_inference

router = APIRouter(tags=["compare"])
REPORT_RESPONSES = {
    200: {"description": "the keys of `flipgate compare --json`, or the HTML report",
          "content": {"application/json": {}, "text/html": {}}},
    202: {"description": "predictions are missing; inference is queued",
          "model": PredictionsPending},
}


@router.get("/compare/{old}/{new}", response_class=Response, responses=REPORT_RESPONSES,
            dependencies=[READ])
def compare(
    old: str, new: str, evalset: str, session: SessionDep, store: StoreDep,
    report_format: Annotated[Literal["json", "html"], Query(alias="format")] = "json",
) -> Response:
    """Compare two versions ("line:version" or "line@alias") on an eval set.

    With the logits of both versions stored, the report is computed once, stored and
    returned. Otherwise an inference job is queued per missing version (asking again returns
    the same open jobs) and the answer is 202 with the job to poll. The jobs are sent to the
    workers (`flipgate worker`, or the one `flipgate serve` starts) once this request commits.
    """
    pair = service.resolve_pair(session=session, old=old, new=new, evalset=evalset)
    jobs = queue_missing_inference(session=session, versions=[pair.old, pair.new],
                                   dataset=pair.dataset)
    if jobs:
        pending = PredictionsPending.for_jobs([job.id for job in jobs])
        return JSONResponse(pending.model_dump(), status_code=202)
    if report_format == "html":
        return HTMLResponse(service.pair_html(session=session, store=store, pair=pair))
    return JSONResponse(service.pair_report(session=session, store=store, pair=pair))


@router.get("/models/{name}/matrix", response_model=PairMatrix, dependencies=[READ])
def matrix(name: str, evalset: str, session: SessionDep, store: StoreDep) -> PairMatrix:
    """NFR, PFR and churn of every ordered pair of the line's versions that have logits on
    the eval set; [i][j] is version i replaced by version j."""
    return service.complete_matrix(session=session, store=store, line_name=name,
                                   dataset=get_dataset(session=session, name=evalset))
