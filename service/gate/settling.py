"""Settling: a pending decision becomes final once every job it waits for has ended; a
failed (or cancelled) job makes it a block. Called when a job ends, never by a read."""

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.compare.service import find_pair_metrics
from service.datasets.service import get_dataset
from service.gate.decisions import waited_jobs
from service.gate.models import Decision, DecisionJob, Verdict
from service.gate.rules import Policy, check, measured_metrics
from service.gate.verdicts import finalize, note
from service.jobs.models import Job, JobState
from service.jobs.service import OPEN_STATES
from service.registry.service import get_version


def settle_pending(*, session: Session, job_ids: Iterable[int] | None = None) -> list[Decision]:
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
        _decide(session, decision)
    return decisions


def _decide(session: Session, decision: Decision) -> None:
    """The final verdict from the stored pair metrics; a block if a measurement failed."""
    failed = [job for job in waited_jobs(session=session, decision=decision)
              if job.state != JobState.SUCCEEDED]
    if failed:
        return finalize(session=session, decision=decision, verdict=Verdict.BLOCK, reasons=[
            note("measurement_failed", f"job {job.id} ({job.kind}) {job.state}: "
                 f"{job.error or 'no error recorded'}", blocking=True) for job in failed])
    measured = _measured(session, decision)
    verdict, reasons = check(Policy.model_validate(decision.policy), measured)
    finalize(session=session, decision=decision, verdict=verdict, reasons=reasons,
             metrics=measured)


def _measured(session: Session, decision: Decision) -> dict[str, dict[str, Any]]:
    """The policy's numbers for each of the decision's eval sets, from stored pair metrics."""
    baseline = get_version(session=session, version_id=decision.baseline_id)
    candidate = get_version(session=session, version_id=decision.candidate_id)
    rows = {name: find_pair_metrics(session=session, old=baseline, new=candidate,
                                    dataset=get_dataset(session=session, name=name))
            for name in decision.evalsets}
    return {name: measured_metrics(row) for name, row in rows.items()}
