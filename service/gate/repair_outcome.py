"""What a repair job's trained model becomes (service.flows.repair_trained calls these): a new
version whose lineage names the repair, and a new decision on it like the original one.

Apart from service.gate.repair_requests (which checks a repair when it is requested, and loads
torch to size it) so that the flows, and every process that imports them, stay light."""

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service.callbacks.targets import full_callback_url
from service.config import Settings
from service.gate.decisions import gate_request, get_decision
from service.gate.models import Decision
from service.gate.schemas import GateRequest
from service.jobs.models import Job
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version, register_version
from service.storage import ArtifactStore


def register_repaired(*, session: Session, store: ArtifactStore, job: Job, path: Path,
                      produced_by: dict[str, Any], metadata: dict[str, Any] | None = None,
                      thresholds: list[float] | None = None) -> ModelVersion:
    """The repaired model as a new version whose parent is the baseline it must replace,
    `produced_by` naming the job, the method and the candidate it repairs (on a multi-label
    line, deciding at `thresholds`, else at those its model declares)."""
    decision = get_decision(session=session, decision_id=job.params["decision_id"])
    baseline = get_version(session=session, version_id=decision.baseline_id)
    candidate = get_version(session=session, version_id=decision.candidate_id)
    line = session.get_one(ModelLine, decision.line_id)
    return register_version(
        session=session, store=store, line_name=line.name, version=job.params["version"],
        onnx_path=path, parent=f"{line.name}:{baseline.version}", metadata=metadata,
        thresholds=thresholds,
        produced_by={"job_id": job.id, "method": job.params["method"],
                     "repair_of": candidate.version, "decision_id": decision.id, **produced_by})


def gate_repaired(*, session: Session, settings: Settings, job: Job,
                  version: ModelVersion) -> Decision:
    """A new decision on the repaired version, against the same baseline and eval sets, with
    the same CI context and callback as the decision it repairs."""
    original = get_decision(session=session, decision_id=job.params["decision_id"])
    request = GateRequest(
        model=session.get_one(ModelLine, original.line_id).name, candidate=version.version,
        baseline=get_version(session=session, version_id=original.baseline_id).version,
        evalsets=original.evalsets, ci=original.ci,
        callback_url=full_callback_url(settings, original.callback_url,
                                       original.callback_url_sealed))
    return gate_request(session=session, settings=settings, request=request,
                        requested_by=f"repair job {job.id}", base_url=original.base_url,
                        repair_of=original)
