"""Settling: a pending decision becomes final once every job it waits for has ended; a
failed (or cancelled) job makes it a block. A decision that needs labels of a traffic set
stays pending (its reasons say how many) until the metrics job of a new label revision
ends. Called when a job ends, never by a read."""

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.gate.decisions import waited_jobs
from service.gate.evidence import decision_evidence
from service.gate.models import Decision, DecisionJob, Verdict
from service.gate.rules import Policy, check
from service.gate.verdicts import decide, note
from service.jobs.models import Job, JobState
from service.jobs.service import OPEN_STATES


def settle_pending(*, session: Session, settings: Settings,
                   job_ids: Iterable[int] | None = None) -> list[Decision]:
    """Make final the pending decisions (those waiting on `job_ids`; all when None) whose
    jobs have all ended."""
    still_open = (select(DecisionJob.decision_id).join(Job, Job.id == DecisionJob.job_id)
                  .where(Job.state.in_(OPEN_STATES)))
    statement = select(Decision).where(Decision.verdict == Verdict.PENDING,
                                       Decision.id.not_in(still_open))
    if job_ids is not None:
        waiting = select(DecisionJob.decision_id).where(DecisionJob.job_id.in_(list(job_ids)))
        statement = statement.where(Decision.id.in_(waiting))
    decisions = list(session.scalars(statement.order_by(Decision.id).with_for_update()
                                     .execution_options(populate_existing=True)))
    for decision in decisions:
        _decide(session, settings, decision)
    return decisions


def _decide(session: Session, settings: Settings, decision: Decision) -> None:
    """The final verdict from the stored pair metrics; a block if a measurement failed."""
    failed = [job for job in waited_jobs(session=session, decision=decision)
              if job.state != JobState.SUCCEEDED]
    if failed:
        return decide(session=session, decision=decision, verdict=Verdict.BLOCK, reasons=[
            note("measurement_failed", f"job {job.id} ({job.kind}) {job.state}: "
                 f"{job.error or 'no error recorded'}", blocking=True) for job in failed])
    policy = Policy.model_validate(decision.policy)
    measured = decision_evidence(session=session, settings=settings, decision=decision,
                                 policy=policy)
    verdict, reasons = check(policy, measured)
    decide(session=session, decision=decision, verdict=verdict, reasons=reasons,
           metrics=measured)
