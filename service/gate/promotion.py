"""Moving a line's production alias: only to a version the gate approved against the current
production version, or by force (admin), and every move is recorded."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import Conflict
from service.gate.models import Decision, Promotion, Verdict
from service.registry.models import ModelVersion
from service.registry.service import (
    PRODUCTION,
    get_line,
    get_named_version,
    production_version,
    set_alias,
)


def promote(*, session: Session, line_name: str, version: str, requested_by: str,
            force: bool = False) -> Promotion:
    """Point production at `version` if an approving decision allows it (or `force`)."""
    line = get_line(session=session, name=line_name)
    target = get_named_version(session=session, line_name=line_name, version=version)
    current = production_version(session=session, line=line, lock=True)
    if current is not None and current.id == target.id:
        raise Conflict("already_production", f"{line_name}:{version} is already production")
    approval = approving_decision(session=session, candidate=target, baseline=current)
    if approval is None and not force:
        raise Conflict("not_approved", f"no approving decision for {line_name}:{version} "
                       f"against the production version "
                       f"({'none' if current is None else current.version}); ask POST /gate")
    set_alias(session=session, line_name=line_name, alias=PRODUCTION, version=version)
    row = Promotion(line_id=line.id, from_version_id=current and current.id,
                    to_version_id=target.id, decision_id=approval and approval.id,
                    forced=approval is None, requested_by=requested_by)
    session.add(row)
    session.flush()
    return row


def approving_decision(*, session: Session, candidate: ModelVersion,
                       baseline: ModelVersion | None) -> Decision | None:
    """The newest approval of candidate against exactly this baseline (None: no baseline)."""
    baseline_is = (Decision.baseline_id.is_(None) if baseline is None
                   else Decision.baseline_id == baseline.id)
    statement = select(Decision).where(Decision.candidate_id == candidate.id, baseline_is,
                                       Decision.verdict == Verdict.APPROVE)
    return session.scalars(statement.order_by(Decision.id.desc()).limit(1)).first()


def list_promotions(*, session: Session, line_name: str) -> list[Promotion]:
    """Every move of the line's production alias, oldest first."""
    line = get_line(session=session, name=line_name)
    statement = select(Promotion).where(Promotion.line_id == line.id).order_by(Promotion.id)
    return list(session.scalars(statement))
