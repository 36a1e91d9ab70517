"""The wire form of a decision, as the webhook, the audit log and the callbacks show it."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.gate.decisions import waited_jobs
from service.gate.models import Callback, Decision, Verdict
from service.gate.schemas import CallbackRead, DecisionRead
from service.jobs.service import OPEN_STATES
from service.registry.models import ModelLine
from service.registry.service import get_version


def decision_view(*, session: Session, decision: Decision) -> DecisionRead:
    """The wire form of a decision, with links to its HTML pair reports and (report_url)
    to its dashboard page, which opens for a signed-in person (sign-in leads back to it)."""
    line = session.get_one(ModelLine, decision.line_id)
    candidate = get_version(session=session, version_id=decision.candidate_id).version
    baseline = (None if decision.baseline_id is None
                else get_version(session=session, version_id=decision.baseline_id).version)
    reports = {name: _report_url(decision.base_url, line.name, baseline, candidate, name)
               for name in decision.metrics}
    return DecisionRead(
        decision_id=decision.id, verdict=decision.verdict, reasons=decision.reasons,
        metrics={name: {**numbers, "report_url": reports[name]}
                 for name, numbers in decision.metrics.items()},
        report_url=f"{decision.base_url}ui/decisions/{decision.id}", model=line.name,
        candidate=candidate,
        baseline=baseline, evalsets=decision.evalsets, policy_version=decision.policy_version,
        policy=decision.policy, requested_by=decision.requested_by, ci=decision.ci,
        callback_url=decision.callback_url, callback=_callback(session, decision),
        waiting_for=_open_jobs(session, decision), repair_of=decision.repair_of_id,
        created_at=decision.created_at, decided_at=decision.decided_at)


def _callback(session: Session, decision: Decision) -> CallbackRead | None:
    """The delivery state of the decision's callback, if it has one."""
    if decision.callback_url is None:
        return None
    row = session.scalars(select(Callback).where(Callback.decision_id == decision.id)
                          ).one_or_none()
    return row and CallbackRead.model_validate(row)


def _open_jobs(session: Session, decision: Decision) -> list[int]:
    """The ids of the jobs a pending decision still waits for."""
    if decision.verdict != Verdict.PENDING:
        return []
    return [job.id for job in waited_jobs(session=session, decision=decision)
            if job.state in OPEN_STATES]


def _report_url(base_url: str, line: str, baseline: str, candidate: str, evalset: str) -> str:
    return f"{base_url}compare/{line}:{baseline}/{line}:{candidate}?evalset={evalset}&format=html"
