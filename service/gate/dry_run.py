"""Policy dry-run: a draft policy replayed on a line's past decisions, nothing stored."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.gate.evidence import decision_evidence
from service.gate.models import Decision, Verdict
from service.gate.policies import check_applies
from service.gate.rules import Policy, check
from service.gate.schemas import DryRun, VerdictChange
from service.registry.models import ModelLine
from service.registry.service import get_line, get_version


def dry_run(*, session: Session, settings: Settings, line_name: str, policy: Policy) -> DryRun:
    """The verdicts `policy` would have given the line's final decisions that compared a pair
    and were measured (on their eval sets, their stored pair metrics and the production
    history of then), and those that differ from the verdict given."""
    line = get_line(session=session, name=line_name)
    check_applies(policy, line)
    replayed, changed = 0, []
    for decision in _comparing_decisions(session, line):
        if _failed(decision):
            continue
        measured = decision_evidence(session=session, settings=settings, decision=decision,
                                     policy=policy, before=decision.created_at)
        if measured is None:  # a pair's metrics are not stored (any more)
            continue
        replayed += 1
        verdict, reasons = check(policy, measured)
        if verdict != decision.verdict:
            changed.append(_change(session, decision, verdict, reasons))
    return DryRun(model=line.name, replayed=replayed, changed=changed)


def _comparing_decisions(session: Session, line: ModelLine) -> list[Decision]:
    """The line's final decisions on a measured pair, oldest first."""
    statement = select(Decision).where(Decision.line_id == line.id,
                                       Decision.baseline_id.is_not(None),
                                       Decision.baseline_id != Decision.candidate_id,
                                       Decision.verdict != Verdict.PENDING)
    return list(session.scalars(statement.order_by(Decision.id)))


def _failed(decision: Decision) -> bool:
    """Whether a measurement of the decision failed (its verdict did not weigh metrics)."""
    return any(reason["code"] == "measurement_failed" for reason in decision.reasons)


def _change(session: Session, decision: Decision, verdict: Verdict,
            reasons: list[dict]) -> VerdictChange:
    """A decision whose verdict the draft policy changes."""
    return VerdictChange(
        decision_id=decision.id, old_verdict=decision.verdict, new_verdict=verdict,
        reasons=reasons, candidate=get_version(session=session,
                                               version_id=decision.candidate_id).version,
        baseline=get_version(session=session, version_id=decision.baseline_id).version)
