"""The MLflow connector's jobs (service.integrations.mlflow queues them).

A candidate alias set on a version: import its ONNX model, gate it under the line's policy,
tag the MLflow version and, on an approval, move production and then the promote alias. The
promote alias on a version that is not production: move it back to production's version (or
remove it) and tag the version `unapproved`. A reconcile job reads every registered model's
aliases and queues those jobs for the moves MLflow's webhook did not deliver. Each step is
idempotent: the import reuses the same bytes, the gate's delivery id answers the same
decision, and a job that dies after its commit leaves a state the reconcile job repairs.
"""

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from flipgate.mlflow_gate import (
    VERDICT_TAG,
    MlflowVersion,
    declared_multilabel,
    mlflow_client,
    onnx_bytes,
    resolve,
    set_verdict_tags,
)
from service import flows
from service.celery_app import MLFLOW_TASK
from service.config import Settings
from service.errors import Conflict, NotFound, library_input
from service.gate.decisions import get_decision, waited_jobs
from service.gate.models import Verdict
from service.gate.promotion import promote
from service.gate.views import decision_view
from service.integrations.mlflow.service import (
    CONNECTOR,
    gate_version,
    log_action,
    queue_alias_job,
    warn_links_left_out,
)
from service.registry.models import ModelVersion
from service.registry.service import (
    get_line,
    get_named_version,
    production_version,
    register_version,
)
from service.storage import ArtifactStore
from worker.runtime import WorkerContext, finishing, job_task, running_job, succeed


def act(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Reconcile, guard the promote alias, or gate a candidate, as the job's params say."""
    settings = ctx.settings
    if params.get("reconcile"):
        return reconcile(ctx, job_id, settings)
    if params["alias"] == settings.mlflow_promote_alias:
        return guard_promotion(ctx, job_id, params, settings)
    return gate_candidate(ctx, job_id, params, settings)


def gate_candidate(ctx: WorkerContext, job_id: int, params: dict[str, Any],
                   settings: Settings) -> None:
    """Import and gate the version; settle at once when the decision is final, else leave
    that to a job waiting for the decision's measurements."""
    client = mlflow_client(settings.mlflow_tracking_uri)
    version = resolve(client, f"models:/{params['model']}/{params['version']}")
    decision_id = params.get("decision_id")
    if decision_id is None:
        with library_input():  # the job fails with the tag's code
            multilabel = declared_multilabel(client, version.name)
        decision_id = import_and_gate(ctx, job_id, params, version, settings, multilabel)
        if decision_id is None:
            return
    settle(ctx, job_id, params, version, decision_id, settings)


def import_and_gate(ctx: WorkerContext, job_id: int, params: dict[str, Any],
                    version: MlflowVersion, settings: Settings,
                    multilabel: bool | None) -> int | None:
    """The decision's id once it is final; None when it is pending (the job then succeeds,
    and a job waiting for the measurements settles it). `multilabel`: the registered model's
    declared kind (None: the line's, single-label for a new one)."""
    model = onnx_bytes(version, settings.mlflow_tracking_uri)
    with ctx.store.scratch() as folder:
        path = folder / "model.onnx"
        path.write_bytes(model)
        with running_job(ctx, job_id) as (session, job):
            registered = import_version(session, ctx.store, version, path, multilabel)
            decision = gate_version(session=session, settings=settings,
                                    candidate=registered)
            if decision.verdict != Verdict.PENDING:
                return decision.id
            log_action(session=session, move=params, action="pending",
                       decision_id=decision.id, message="measuring the pair")
            follow_up = queue_alias_job(session=session, move={**params, "decision_id":
                                                                decision.id},
                                        waits_for=waited_jobs(session=session,
                                                              decision=decision))
            succeed(ctx, session, job, {"decision_id": decision.id, "settled_by": follow_up.id})
    return None


def import_version(session: Session, store: ArtifactStore, version: MlflowVersion,
                   path: Path, multilabel: bool | None) -> ModelVersion:
    """The flipgate version of an MLflow version: the one registered before when its bytes
    are the same (409 `version_conflict` when not), else a new one of a line of the kind
    `multilabel` declares (a line of another kind refuses it), measured as usual."""
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        existing = get_named_version(session=session, line_name=version.name,
                                     version=version.version)
    except NotFound:
        registered = register_version(
            session=session, store=store, line_name=version.name, version=version.version,
            onnx_path=path, metadata=version.metadata(), multilabel=multilabel,
            source=f"MLflow {version.name} version {version.version}")
        flows.version_registered(session=session, version=registered)
        return registered
    if existing.artifact_sha256 != sha256:
        raise Conflict("version_conflict", f"flipgate's {version.name}:{version.version} "
                       "holds another model than this MLflow version")
    return existing


def settle(ctx: WorkerContext, job_id: int, params: dict[str, Any], version: MlflowVersion,
           decision_id: int, settings: Settings) -> None:
    """Tag the MLflow version with the final decision and, on an approval, move production
    (committed first) and then the promote alias."""
    client = mlflow_client(settings.mlflow_tracking_uri)
    with finishing(ctx, job_id) as (session, result):
        decision = get_decision(session=session, decision_id=decision_id)
        if decision.verdict == Verdict.PENDING:
            raise Conflict("decision_pending", f"decision {decision_id} is still pending")
        view = decision_view(session=session, decision=decision).model_dump(mode="json")
        approved = decision.verdict == Verdict.APPROVE and promote_once(session, version)
        log_action(session=session, move=params, action="promoted" if approved
                   else str(decision.verdict), decision_id=decision.id,
                   message=f"decision {decision.id}: {decision.verdict}")
        if not settings.public_url:
            warn_links_left_out()
        set_verdict_tags(client, version, view)
        result.update(decision_id=decision.id, verdict=str(decision.verdict), promoted=approved)
    if approved:
        client.set_registered_model_alias(version.name, settings.mlflow_promote_alias,
                                          version.version)


def promote_once(session: Session, version: MlflowVersion) -> bool:
    """Move production to the version (already there counts as moved)."""
    try:
        promote(session=session, line_name=version.name, version=version.version,
                requested_by=CONNECTOR)
    except Conflict as error:
        if error.code != "already_production":
            raise
    return True


def guard_promotion(ctx: WorkerContext, job_id: int, params: dict[str, Any],
                    settings: Settings) -> None:
    """Move the promote alias back to production's version when it points elsewhere (one of
    flipgate's own moves points at production: nothing to do)."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(settings.mlflow_tracking_uri)
    alias, model = settings.mlflow_promote_alias, params["model"]
    try:
        current = str(client.get_model_version_by_alias(model, alias).version)
    except MlflowException:
        current = None  # the alias was removed since
    with finishing(ctx, job_id) as (session, result):
        target = approved_version(session, model)
        result.update(current=current, approved=target)
        if current is None or current == target:
            return
        log_action(session=session, move={**params, "version": current}, action="reverted",
                   message=f"{alias} moved by hand to unapproved version {current}; moved "
                           f"back to {target or 'no version'}")
    client.set_model_version_tag(model, current, VERDICT_TAG, "unapproved")
    if target is None:
        client.delete_registered_model_alias(model, alias)
    else:
        client.set_registered_model_alias(model, alias, target)


def approved_version(session: Session, model: str) -> str | None:
    """The version of the line that the gate's approvals put in production, if any."""
    try:
        line = get_line(session=session, name=model)
    except NotFound:
        return None
    production = production_version(session=session, line=line)
    return production and production.version


def reconcile(ctx: WorkerContext, job_id: int, settings: Settings) -> None:
    """Queue the jobs for alias moves MLflow did not deliver: a candidate without a final
    verdict tag, a promote alias on a version that is not production."""
    client = mlflow_client(settings.mlflow_tracking_uri)
    moves = [move for model in registered_models(client)
             for move in unsettled_moves(client, model, settings)]
    with finishing(ctx, job_id) as (session, result):
        queued = [queue_alias_job(session=session, move=move) for move in moves
                  if move["alias"] == settings.mlflow_candidate_alias
                  or move["version"] != approved_version(session, move["model"])]
        result["queued"] = [job.id for job in queued]


def registered_models(client, page_size: int = 100) -> Iterator:
    """Every registered model, page by page (MLflow answers at most `page_size` at a time)."""
    token = None
    while True:
        page = client.search_registered_models(max_results=page_size, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def unsettled_moves(client, model, settings: Settings) -> list[dict[str, str]]:
    """The registered model's candidate alias when its version has no final verdict tag,
    and its promote alias."""
    aliases = model.aliases or {}
    moves = []
    candidate = aliases.get(settings.mlflow_candidate_alias)
    if candidate is not None:
        tags = client.get_model_version(model.name, candidate).tags
        if tags.get(VERDICT_TAG) in (None, "pending"):
            moves.append({"model": model.name, "alias": settings.mlflow_candidate_alias,
                          "version": str(candidate)})
    if settings.mlflow_promote_alias in aliases:
        moves.append({"model": model.name, "alias": settings.mlflow_promote_alias,
                      "version": str(aliases[settings.mlflow_promote_alias])})
    return moves


connector = job_task(MLFLOW_TASK, act)
