"""MLflow's webhook (no bearer token: MLflow signs its deliveries) and the connector's log."""

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse

from service.deps import CommittingRoute, ReadAccess, SessionDep, SettingsDep, act_signed
from service.gate.webhook_auth import RawBody
from service.integrations.mlflow import service
from service.integrations.mlflow.models import DELIVERY_ID_LENGTH
from service.integrations.mlflow.schemas import MlflowEventRead

router = APIRouter(tags=["integrations"], route_class=CommittingRoute)
DeliveryId = Annotated[str | None, Header(alias="X-MLflow-Delivery-Id",
                                          max_length=DELIVERY_ID_LENGTH)]
Timestamp = Annotated[str | None, Header(alias="X-MLflow-Timestamp", max_length=20)]
MLFLOW = "mlflow"  # the audit trail's caller of a signed delivery
Signature = Annotated[str | None, Header(alias="X-MLflow-Signature", max_length=200)]


@router.post("/integrations/mlflow/webhook", status_code=200, responses={
    202: {"description": "queued: a job acts on the alias move"}})
def mlflow_webhook(request: Request, body: RawBody, session: SessionDep, settings: SettingsDep,
                   delivery_id: DeliveryId = None, timestamp: Timestamp = None,
                   signature: Signature = None) -> JSONResponse:
    """MLflow's webhook, signed with FLIPGATE_MLFLOW_WEBHOOK_SECRET. Setting the candidate or
    the promote alias queues a job and answers 202 at once; a delivery received before, MLflow's
    test delivery and every other event answer 200 and change nothing. A queued job is an
    audit event of `mlflow` (auth `webhook`) in the connector's project."""
    service.check_signature(settings=settings, delivery_id=delivery_id, timestamp=timestamp,
                            signature=signature, body=body)
    move = service.alias_move(body, settings)
    if move is None:
        return JSONResponse({"status": "ignored"})
    project = service.serve_project(session=session, settings=settings)
    job = service.receive(session=session, delivery_id=delivery_id, move=move)
    if job is None:
        return JSONResponse({"status": "duplicate"})
    act_signed(request, MLFLOW, project)
    request.state.audit_details = {"delivery_id": delivery_id, "job_id": job.id, **move}
    return JSONResponse({"status": "queued", "job_id": job.id}, status_code=202)


@router.get("/models/{name}/mlflow-events", response_model=list[MlflowEventRead])
def list_mlflow_events(name: str, session: SessionDep, settings: SettingsDep,
                       acting: ReadAccess,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list:
    """The MLflow connector's log on the registered model `name`, newest first: deliveries
    received, verdicts, promotions and reverted hand moves (empty in every project but the
    one the connector serves, FLIPGATE_MLFLOW_PROJECT)."""
    if not service.is_connector_project(project=acting.project, settings=settings):
        return []
    return service.list_events(session=session, model=name, limit=limit)
