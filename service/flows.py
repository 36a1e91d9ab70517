"""What follows an event, in one place (the "flows" of Netflix Dispatch): which jobs to queue
or send, which to cancel, and which pending gate decisions to settle.

Each event calls its flow from one place per origin:
- a version is registered: POST /models (service.registry.router) calls
  `version_registered`;
- a repair's model is trained: the repair job (worker.training) calls `repair_trained`, which
  registers it (then `version_registered`) and gates it again;
- logits are stored: POST .../predictions (service.predictions.router) and an inference job
  (worker.tasks) call `logits_stored` (pair reports against the baselines, and the line's
  matrix job);
- a pair's report is measured: the metrics job (worker.tasks) stores it with
  `pair_measured`;
- a job ends: the worker runtime (worker.runtime) ends it with `finish_job`, POST
  /jobs/{id}/cancel (service.jobs.router) with `cancel_job`;
- a job's lease expires (its worker was lost): the worker's sweeper (worker.sweeper) calls
  `reap_lost_jobs`.
- a project's grant is changed or removed: PUT and DELETE /projects/{project}/members
  (service.projects.router) call `change_grant` and `remove_grant`, which revoke the
  personal tokens it no longer covers (service.auth.personal), each an audit event of the
  request's caller.
- labels are posted to a traffic set: POST /evalsets/{name}/labels (service.datasets.router)
  calls `labels_posted`, which stores them as a new label revision (their class names read,
  when the set names none, from the lines measured on it) and calls `labels_added` (its
  pairs measured again with the new label revision).
Registering an eval set queues nothing: no line has been measured on it yet.

The domains below (service.compare, service.predictions, service.jobs) know how to queue a
measurement; this module decides when. Nothing else sends waiting jobs or settles decisions.

A job's changes that a person would ask about (a decision it settled, the version a repair
registered and the decision on it, a traffic report measured again with new labels) are
audit events of the job, written here in the transaction that makes them
(service.audit.service.record_job_change).
"""

from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from service import urls
from service.audit.requests import add_event, caller_of
from service.audit.service import record_job_change
from service.auth.personal import GRANT_REMOVED, REVOKE, ROLE_LOWERED, revoke_unheld_tokens
from service.compare.matrix import queue_matrix
from service.compare.models import PairMetrics
from service.compare.service import (
    Pair,
    find_pair_metrics,
    queue_measurement,
    store_pair_metrics,
)
from service.config import Settings
from service.datasets.labels import add_labels, label_revision
from service.datasets.models import Dataset, DatasetLabels, DatasetRole
from service.gate.models import Decision, DecisionJob, Verdict
from service.gate.repair_outcome import gate_repaired, register_repaired
from service.gate.settling import settle_pending
from service.jobs import service as jobs
from service.jobs.enqueue import release_waiting
from service.jobs.leases import lost_jobs, requeue
from service.jobs.models import Job, JobState
from service.predictions.service import (
    measured_class_names,
    measured_datasets,
    queue_missing_inference,
    versions_with_predictions,
)
from service.projects import service as projects
from service.projects.models import Project, ProjectMember
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version, production_version_id, qualified_name
from service.storage import ArtifactStore


def version_registered(*, session: Session, version: ModelVersion) -> list[Job]:
    """Score a new version on every eval set its line was measured on, and measure it there
    against its parent and its line's production version (metrics jobs that wait for the
    inference they need)."""
    baselines = _baselines(session, version)
    jobs_by_id = {job.id: job for dataset in measured_datasets(session=session,
                                                               line_id=version.line_id)
                  for job in [*queue_missing_inference(session=session, versions=[version],
                                                       dataset=dataset),
                              *_measure(session, baselines, version, dataset)]}
    return list(jobs_by_id.values())


def repair_trained(*, session: Session, settings: Settings, store: ArtifactStore, job_id: int,
                   path: Path, produced_by: dict[str, Any],
                   metadata: dict[str, Any] | None = None,
                   thresholds: list[float] | None = None) -> tuple[ModelVersion, Decision]:
    """The running repair job `job_id` trained its model (at `path`): it becomes a new version
    of the line (measured like any registered version; on a multi-label line deciding at
    `thresholds`, else at those its model declares), and a new decision on it is asked for
    like the one it repairs."""
    job = jobs.get_job(session=session, job_id=job_id)
    version = register_repaired(session=session, store=store, job=job, path=path,
                                produced_by=produced_by, metadata=metadata,
                                thresholds=thresholds)
    record_job_change(session, job=job, action="register_version",
                      resource=urls.version(session.get_one(ModelLine, version.line_id).name,
                                            version.version),
                      details={"repair_of": version.produced_by["repair_of"]})
    version_registered(session=session, version=version)
    decision = gate_repaired(session=session, settings=settings, job=job, version=version)
    record_job_change(session, job=job, action="gate", resource=urls.decision(decision.id),
                      details={"decision_id": decision.id, "verdict": decision.verdict})
    return version, decision


def logits_stored(*, session: Session, version: ModelVersion, dataset: Dataset) -> list[Job]:
    """Measure a version whose logits on an eval set were stored against its parent and
    production version, where they have logits on that set too, and count its pairs with
    the line's other versions there (the line's matrix job)."""
    if dataset.role != DatasetRole.EVAL:
        return []
    baselines = versions_with_predictions(session=session, dataset=dataset,
                                          versions=_baselines(session, version))
    measuring = _measure(session, baselines, version, dataset)
    line = session.get_one(ModelLine, version.line_id)
    matrix = queue_matrix(session=session, line_name=line.name, dataset=dataset)
    return [*measuring, *filter(None, [matrix])]


def pair_measured(*, session: Session, job_id: int, pair: Pair, report: dict[str, Any],
                  html_sha256: str | None) -> PairMetrics:
    """Store the report the metrics job `job_id` measured (a report stored meanwhile is
    kept); a pair measured again with a newer label revision of its traffic set is the
    job's audit event."""
    earlier = find_pair_metrics(session=session, old=pair.old, new=pair.new,
                                dataset=pair.dataset)
    row = store_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset,
                             report=report, html_sha256=html_sha256)
    if earlier is not None and earlier.label_revision < row.label_revision:
        record_job_change(
            session, job=jobs.get_job(session=session, job_id=job_id),
            action="measure_with_labels", resource=urls.compare(
                *(qualified_name(session=session, version=side) for side in (pair.old, pair.new)),
                pair.dataset.name),
            details={"label_revision": row.label_revision,
                     "previous_revision": earlier.label_revision})
    return row


def _measure(session: Session, baselines: list[ModelVersion], version: ModelVersion,
             dataset: Dataset) -> list[Job]:
    """The jobs that measure each baseline → version on `dataset` (none for stored pairs),
    with a traffic set's newest labels."""
    revision = label_revision(session=session, dataset=dataset)
    return [job for old in baselines for job in queue_measurement(
        session=session, pair=Pair(old, version, dataset, revision))]


def labels_posted(*, session: Session, store: ArtifactStore, dataset: Dataset,
                  labels_path: Path, source: str) -> tuple[DatasetLabels | None, list[Job]]:
    """Add a labels file to a traffic set (service.datasets.labels.add_labels, with the class
    names of the lines measured on it) and measure its pairs again: the new revision and its
    jobs, or None and no job when every label was known already."""
    labels = add_labels(session=session, store=store, dataset=dataset, labels_path=labels_path,
                        source=source, line_class_names=measured_class_names(session=session,
                                                                             dataset=dataset))
    return labels, ([] if labels is None else labels_added(session=session, labels=labels))


def labels_added(*, session: Session, labels: DatasetLabels) -> list[Job]:
    """Measure again, with the new label revision, every pair measured on the traffic set
    (the metrics jobs of the reports that name it)."""
    dataset = session.get_one(Dataset, labels.dataset_id)
    measured = session.execute(select(PairMetrics.old_version_id, PairMetrics.new_version_id)
                               .where(PairMetrics.dataset_id == dataset.id).distinct()).all()
    return [job for old_id, new_id in sorted(measured) for job in queue_measurement(
        session=session, pair=Pair(get_version(session=session, version_id=old_id),
                                   get_version(session=session, version_id=new_id), dataset,
                                   labels.revision))]


def _baselines(session: Session, version: ModelVersion) -> list[ModelVersion]:
    """The version's parent and its line's production version, each once, if comparable."""
    production = production_version_id(session=session, line_id=version.line_id)
    ids = [id_ for id_ in dict.fromkeys([version.parent_id, production])
           if id_ not in (None, version.id)]
    return [baseline for baseline in (get_version(session=session, version_id=id_) for id_ in ids)
            if baseline.num_classes == version.num_classes]


def finish_job(*, session: Session, settings: Settings, job: Job, state: JobState,
               result: dict | None = None, error: str | None = None) -> Job:
    """End a running job (service.jobs.service.mark_finished: a failure also ends its family
    and cancels the jobs waiting for it); when it succeeded, the jobs waiting for it that are
    ready now are sent; the decisions waiting for it settle."""
    jobs.mark_finished(session=session, job=job, state=state, result=result, error=error)
    if state == JobState.SUCCEEDED:
        release_waiting(session=session, job=job)
    for decision in _settle(session, settings, job):
        if decision.verdict != Verdict.PENDING:
            record_job_change(session, job=job, action="settle_decision",
                              resource=urls.decision(decision.id),
                              details={"decision_id": decision.id, "verdict": decision.verdict})
    return job


def cancel_job(*, session: Session, settings: Settings, job_id: int) -> Job:
    """Cancel a queued or running job with its shards and the jobs waiting for it; the
    decisions waiting for it are blocked."""
    job = jobs.mark_cancelled(session=session, job_id=job_id)
    _settle(session, settings, job)
    return job


def _settle(session: Session, settings: Settings, job: Job) -> list[Decision]:
    """Settle the pending decisions whose jobs have all ended. Those waiting for `job` (or its
    parent) are locked first, in a statement of their own: a transaction ending another of
    their jobs at the same time commits first, and then one of the two sees both ended."""
    waiting = select(DecisionJob.decision_id).where(
        DecisionJob.job_id.in_([job.id, job.parent_id or job.id]))
    session.scalars(select(Decision.id).where(Decision.id.in_(waiting),
                                              Decision.verdict == Verdict.PENDING)
                    .order_by(Decision.id).with_for_update()).all()
    return settle_pending(session=session, settings=settings)


def reap_lost_jobs(*, session: Session, settings: Settings, lease_seconds: float,
                   max_attempts: int) -> list[Job]:
    """Queue again the running jobs whose lease expired (their worker was lost), or fail those
    that have had `max_attempts` runs, like any failure (the decisions waiting on them block)."""
    lost = lost_jobs(session=session, lease_seconds=lease_seconds)
    for job in lost:
        if job.state != JobState.RUNNING:  # ended with a shard that failed just before
            continue
        if job.attempts < max_attempts:
            requeue(session=session, job=job)
        else:
            finish_job(session=session, settings=settings, job=job, state=JobState.FAILED,
                       error=f"worker_lost: no heartbeat for {lease_seconds:g} s, "
                             f"{job.attempts} attempts made")
    return lost


def change_grant(*, session: Session, request: HTTPConnection, project: Project, kind: str,
                 principal: str, role: str) -> ProjectMember:
    """Grant `principal` the role `role` in `project`; the personal tokens there whose
    owner no longer holds their scopes are revoked (reason role_lowered)."""
    member = projects.grant(session=session, project=project, kind=kind, principal=principal,
                            role=role)
    _revoke_unheld(session, request, project, ROLE_LOWERED)
    return member


def remove_grant(*, session: Session, request: HTTPConnection, project: Project, kind: str,
                 principal: str) -> None:
    """Take the grant of `principal` in `project` back; the personal tokens there whose
    owner no longer holds their scopes are revoked (reason grant_removed)."""
    projects.revoke(session=session, project=project, kind=kind, principal=principal)
    _revoke_unheld(session, request, project, GRANT_REMOVED)


def _revoke_unheld(session: Session, request: HTTPConnection, project: Project,
                   reason: str) -> None:
    """Revoke the personal tokens of `project` their owners no longer hold, each an `ok`
    audit event `revoke_personal_token` of the request's caller."""
    settings: Settings = request.app.state.settings
    for token in revoke_unheld_tokens(session=session, project=project,
                                      admin_group=settings.oidc_admin_group):
        add_event(session, request, caller_of(request), action=REVOKE, reason=reason,
                  details={"name": token.name, "owner": token.owner})
