"""A line's gate policy: versioned, never changed once stored; the default applies until one
is set."""

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.datasets.models import DatasetRole
from service.datasets.service import get_dataset_of_role
from service.db import insert_or_conflict, one_or_not_found
from service.errors import InvalidInput
from service.gate.models import GatePolicy
from service.gate.rules import DEFAULT_POLICY, Policy
from service.gate.schemas import PolicyRead
from service.registry.models import ModelLine
from service.registry.service import describe_kind, get_line


def put_policy(*, session: Session, line_name: str, policy: Policy,
               created_by: str) -> GatePolicy:
    """Store `policy` as the line's next policy version; its eval sets must exist and its
    limits apply to the line's kind."""
    line = get_line(session=session, name=line_name)
    check_applies(policy, line)
    for name in policy.evalsets:
        get_dataset_of_role(session=session, name=name, role=DatasetRole.EVAL)
    latest = session.scalar(select(func.max(GatePolicy.version))
                            .where(GatePolicy.line_id == line.id)) or 0
    row = GatePolicy(line_id=line.id, version=latest + 1, created_by=created_by,
                     rules=policy.model_dump(exclude_none=True))
    return insert_or_conflict(session, row, code="policy_changed", message=f"the policy of "
                              f"{line_name!r} changed meanwhile; send it again")


def check_applies(policy: Policy, line: ModelLine) -> None:
    """Refuse a policy that sets a limit the line's kind is not checked against
    (`policy_limit_not_applicable`): a limit ignored would approve what it was set to block;
    likewise a per-label limit naming a label the line's class names lack (`unknown_label`)."""
    if names := policy.inapplicable(multilabel=line.multilabel):
        raise InvalidInput("policy_limit_not_applicable", f"model line {line.name!r} is "
                           f"{describe_kind(line.multilabel)}: {', '.join(names)} do not apply "
                           "to it (docs/gate.md, \"Multi-label lines\")")
    for name, labels in policy.named_labels().items():
        if line.class_names and (unknown := [lab for lab in labels
                                             if lab not in line.class_names]):
            raise InvalidInput("unknown_label", f"{name} names label {unknown[0]!r}, which "
                               f"model line {line.name!r} does not have (its labels are "
                               f"{line.class_names[:20]})")


def current_policy(*, session: Session, line: ModelLine) -> GatePolicy | None:
    """The line's newest policy version, if one was ever set."""
    statement = select(GatePolicy).where(GatePolicy.line_id == line.id)
    return session.scalars(statement.order_by(GatePolicy.version.desc()).limit(1)).first()


def get_policy(*, session: Session, line_name: str, version: int) -> GatePolicy:
    """One stored version of a line's policy."""
    line = get_line(session=session, name=line_name)
    statement = select(GatePolicy).where(GatePolicy.line_id == line.id,
                                         GatePolicy.version == version)
    return one_or_not_found(session, statement, code="policy_not_found",
                            message=f"{line_name!r} has no policy version {version}")


def policy_read(*, name: str, row: GatePolicy | None) -> PolicyRead:
    """A stored policy version, or the default policy when none was ever set."""
    if row is None:
        return PolicyRead(model=name, version=None, rules=DEFAULT_POLICY, created_by=None,
                          created_at=None)
    return PolicyRead(model=name, version=row.version, rules=row.rules,
                      created_by=row.created_by, created_at=row.created_at)
