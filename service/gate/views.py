"""The wire form of a decision, as the webhook, the audit log and the callbacks show it."""

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import urls
from service.callbacks.models import Callback
from service.gate.models import Decision, DecisionJob, Verdict
from service.gate.schemas import CallbackRead, DecisionRead
from service.jobs.models import Job
from service.jobs.service import OPEN_STATES
from service.projects.models import Project
from service.registry.models import ModelLine, ModelVersion


def decision_view(*, session: Session, decision: Decision) -> DecisionRead:
    """The wire form of a decision, with links to its HTML pair reports and (report_url)
    to its dashboard page, which opens for a signed-in person (sign-in leads back to it)."""
    return decision_views(session=session, decisions=[decision])[0]


def decision_views(*, session: Session, decisions: list[Decision]) -> list[DecisionRead]:
    """The wire forms of decisions in a fixed number of queries, however many: their lines,
    versions, callbacks and open jobs are read together first."""
    lines = _by_id(session, ModelLine, {decision.line_id for decision in decisions})
    projects = _by_id(session, Project, {decision.project_id for decision in decisions})
    versions = _by_id(session, ModelVersion, {version for decision in decisions for version in (
        decision.candidate_id, decision.baseline_id) if version is not None})
    callbacks = _callbacks(session, [decision.id for decision in decisions
                                     if decision.callback_url is not None])
    open_jobs = _open_jobs(session, [decision.id for decision in decisions
                                     if decision.verdict == Verdict.PENDING])
    return [_view(decision, lines[decision.line_id].name, projects[decision.project_id].name,
                  versions, callbacks.get(decision.id), open_jobs.get(decision.id, []))
            for decision in decisions]


def _view(decision: Decision, line: str, project: str, versions: dict[int, ModelVersion],
          callback: Callback | None, open_jobs: list[int]) -> DecisionRead:
    candidate = versions[decision.candidate_id].version
    baseline = None if decision.baseline_id is None else versions[decision.baseline_id].version
    reports = {name: _report_url(decision.base_url, line, baseline, candidate, name)
               for name in decision.metrics}
    return DecisionRead(
        decision_id=decision.id, verdict=decision.verdict,
        reasons=[_with_export(reason, decision.base_url, f"{line}:{baseline}",
                              f"{line}:{candidate}") for reason in decision.reasons],
        labels_needed=_labels_needed(decision),
        metrics={name: {**numbers, "report_url": reports[name]}
                 for name, numbers in decision.metrics.items()},
        report_url=urls.on(decision.base_url, urls.ui_decision(decision.id, project)), model=line,
        candidate=candidate,
        baseline=baseline, evalsets=decision.evalsets, policy_version=decision.policy_version,
        policy=decision.policy, requested_by=decision.requested_by, ci=decision.ci,
        callback_url=decision.callback_url,
        callback=callback and CallbackRead.model_validate(callback), waiting_for=open_jobs,
        repair_of=decision.repair_of_id, created_at=decision.created_at,
        decided_at=decision.decided_at)


def _labels_needed(decision: Decision) -> int | None:
    """A pending decision's unlabelled disagreements, counted once per traffic set (several
    limits may wait on the same set)."""
    if decision.verdict != Verdict.PENDING:
        return None
    return sum({reason["evalset"]: reason["labels_needed"] for reason in decision.reasons
                if reason.get("pending")}.values())


def _with_export(reason: dict[str, Any], base_url: str, old: str, new: str) -> dict[str, Any]:
    """A labels_needed reason with the address of the disagreements' export to label."""
    if reason.get("code") != "labels_needed":
        return reason
    return {**reason, "export_url": urls.on(base_url, urls.disagreements(
        old, new, reason["evalset"], "label-studio"))}


def _by_id(session: Session, model: type[ModelLine] | type[ModelVersion] | type[Project],
           ids: set[int]) -> dict[int, Any]:
    """The rows with these ids, in one query."""
    if not ids:
        return {}
    return {row.id: row for row in session.scalars(select(model).where(model.id.in_(ids)))}


def _callbacks(session: Session, decision_ids: list[int]) -> dict[int, Callback]:
    """The delivery state of each decision's callback."""
    if not decision_ids:
        return {}
    rows = session.scalars(select(Callback).where(Callback.decision_id.in_(decision_ids)))
    return {row.decision_id: row for row in rows}


def _open_jobs(session: Session, decision_ids: list[int]) -> dict[int, list[int]]:
    """The ids of the jobs each pending decision still waits for."""
    if not decision_ids:
        return {}
    rows = session.execute(select(DecisionJob.decision_id, Job.id)
                           .join(Job, Job.id == DecisionJob.job_id)
                           .where(DecisionJob.decision_id.in_(decision_ids),
                                  Job.state.in_(OPEN_STATES)).order_by(Job.id))
    waiting: dict[int, list[int]] = {}
    for decision_id, job_id in rows:
        waiting.setdefault(decision_id, []).append(job_id)
    return waiting


def _report_url(base_url: str, line: str, baseline: str, candidate: str, evalset: str) -> str:
    return urls.on(base_url, urls.compare(f"{line}:{baseline}", f"{line}:{candidate}", evalset,
                                          html=True))
