"""The training task: repair a blocked candidate, register the result and gate it again
(it runs on worker.runtime; the request is checked and queued by service.gate.repair)."""

import hashlib
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from flipgate.formats import load_evalset
from flipgate.train import recipes
from flipgate.train.config import TrainConfig
from flipgate.train.methods import METHODS
from flipgate.train.recipes import ProgressFactory
from service import flows
from service.config import get_settings
from service.datasets.service import get_dataset
from service.db import session_scope
from service.gate.decisions import gate, get_decision
from service.gate.models import Decision
from service.gate.schemas import GateRequest
from service.predictions.service import score_version
from service.queue import TRAIN_TASK
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version, register_version
from worker.runtime import JobProgress, WorkerContext, finishing, job_task


def repair(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Retrain a blocked candidate with a flip-reducing method (service.gate.repair), then
    register the new version with its lineage and gate it like the original."""
    with session_scope(ctx.sessions) as session:
        line = session.get_one(ModelLine, get_decision(
            session=session, decision_id=params["decision_id"]).line_id)
        dataset = get_dataset(session=session, name=params["dataset"])
        old = (None if params["old_version_id"] is None
               else get_version(session=session, version_id=params["old_version_id"]))
    data = load_evalset(ctx.store.path(dataset.sha256))
    old_logits = None if old is None else score_version(store=ctx.store, version=old,
                                                        dataset=dataset)[0]
    trained = recipes.train(
        params["method"], params["arch"], data, line.num_classes, TrainConfig(**params["config"]),
        METHODS[params["method"]].options(**params["options"]), old_logits,
        progress=phase_progress(ctx, job_id, METHODS[params["method"]].phases))
    with tempfile.TemporaryDirectory() as folder:
        path = trained.save(Path(folder) / "model.onnx", data.sample_shape)
        with finishing(ctx, job_id) as (session, result):
            version = register_repaired(ctx, session, job_id, params, line, path, trained.record)
            decision = gate_again(session, job_id, version, params["decision_id"])
            result.update(version=version.version, decision_id=decision.id,
                          repaired_decision_id=params["decision_id"],
                          version_url=f"/models/{line.name}/versions/{version.version}",
                          decision_url=f"/gate/decisions/{decision.id}")


def phase_progress(ctx: WorkerContext, job_id: int, phases: int) -> ProgressFactory:
    """Progress callbacks for a recipe's phases, each filling its share of the job's 0..1."""
    counter = itertools.count()

    def for_phase(_label: str) -> JobProgress:
        index = min(next(counter), phases - 1)
        return JobProgress(ctx, job_id, start=index / phases, span=1 / phases)

    return for_phase


def register_repaired(ctx: WorkerContext, session: Session, job_id: int, params: dict[str, Any],
                      line: ModelLine, path: Path, record: dict[str, Any]) -> ModelVersion:
    """The trained model as a new version whose parent is the baseline it must replace; its
    follow-up inference and metrics jobs are queued."""
    decision = get_decision(session=session, decision_id=params["decision_id"])
    baseline = get_version(session=session, version_id=decision.baseline_id)
    candidate = get_version(session=session, version_id=decision.candidate_id)
    version = register_version(
        session=session, store=ctx.store, line_name=line.name, version=params["version"],
        onnx_path=path, parent=f"{line.name}:{baseline.version}",
        metadata={"arch": params["arch"]}, produced_by={
            "job_id": job_id, "method": params["method"], "repair_of": candidate.version,
            "decision_id": decision.id, "dataset": params["dataset"], "record": record})
    flows.version_registered(session=session, version=version)
    return version


def gate_again(session: Session, job_id: int, version: ModelVersion,
               decision_id: int) -> Decision:
    """A new decision on the repaired version, against the same baseline and eval sets."""
    original = get_decision(session=session, decision_id=decision_id)
    request = GateRequest(
        model=session.get_one(ModelLine, original.line_id).name, candidate=version.version,
        baseline=get_version(session=session, version_id=original.baseline_id).version,
        evalsets=original.evalsets, ci=original.ci, callback_url=original.callback_url)
    body = json.dumps(request.model_dump(mode="json"), sort_keys=True).encode()
    return gate(session=session, settings=get_settings(), request=request,
                requested_by=f"repair job {job_id}",
                base_url=original.base_url, request_sha256=hashlib.sha256(body).hexdigest(),
                repair_of=original)


train = job_task(TRAIN_TASK, repair)
