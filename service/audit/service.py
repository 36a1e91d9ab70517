"""Writing audit events (each also one log line, once its transaction commits) and reading
them back, newest first, a page at a time."""

import base64
import binascii
import getpass
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Select, event, select
from sqlalchemy.orm import Session

from service.audit.models import AuditEvent
from service.errors import InvalidInput
from service.projects.models import Project

OK, DENIED = "ok", "denied"
CLI = "cli"
JOB = "job"  # the auth of a change a worker's job made
PENDING = "flipgate_audit_pending"  # session.info: the events its transaction will commit
CURSOR_PREFIX = "before:"
logger = logging.getLogger("flipgate.audit")


@dataclass(frozen=True)
class Caller:
    """Who an event is about: a token's name (or `webhook`, a signed-in subject, an OS
    user), how they authenticated, and the project they acted in (None: the server)."""

    actor: str
    auth: str
    project_id: int | None
    email: str | None = None


def record_event(session: Session, *, caller: Caller, action: str, resource: str,
                 outcome: str = OK, reason: str | None = None, request_id: str | None = None,
                 client: str | None = None, details: dict[str, Any] | None = None) -> AuditEvent:
    """Add an event to `session`'s transaction; it is logged when that transaction commits."""
    row = AuditEvent(actor=caller.actor, actor_email=caller.email, auth=caller.auth,
                     project_id=caller.project_id, action=action, resource=resource,
                     outcome=outcome, reason=reason, request_id=request_id, client=client,
                     details=details)
    session.add(row)
    if PENDING not in session.info:
        event.listen(session, "after_commit", _log_committed)
        event.listen(session, "after_rollback", _forget_pending)
        session.info[PENDING] = []
    session.info[PENDING].append(row)
    return row


def record_cli(session: Session, *, action: str, resource: str, project_id: int | None,
               details: dict[str, Any] | None = None) -> AuditEvent:
    """The event of a change the `flipgate` command made on the database: its actor is the
    operating system's user, its auth `cli`."""
    caller = Caller(actor=os_user(), auth=CLI, project_id=project_id)
    return record_event(session, caller=caller, action=action, resource=resource,
                        details=details)


class JobOrigin(Protocol):
    """What the event of a job's change reads of the job (a service.jobs.models.Job)."""

    id: int
    kind: str
    project_id: int
    request_id: str | None


def record_job_change(session: Session, *, job: JobOrigin, action: str, resource: str,
                      details: dict[str, Any] | None = None) -> AuditEvent:
    """The event of a change a worker's job made: its actor the job (`job 42`, auth `job`),
    in the job's project, under the id of the request that queued the job."""
    caller = Caller(actor=f"job {job.id}", auth=JOB, project_id=job.project_id)
    return record_event(session, caller=caller, action=action, resource=resource,
                        request_id=job.request_id,
                        details={"job_id": job.id, "kind": str(job.kind), **(details or {})})


def os_user() -> str:
    """The name of the user running this process (its uid when it has none)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no USER/LOGNAME and no passwd entry (a bare container)
        return f"uid:{os.getuid()}"


def _log_committed(session: Session) -> None:
    for row in session.info.get(PENDING, ()):
        logger.info("audit %s %s %s by %s (%s)", row.outcome, row.action, row.resource,
                    row.actor, row.auth, extra={"audit": log_fields(row)})
    session.info[PENDING] = []


def _forget_pending(session: Session) -> None:
    session.info[PENDING] = []


def log_fields(row: AuditEvent) -> dict[str, Any]:
    """An event as the fields of its log line."""
    return {"id": row.id, "actor": row.actor, "actor_email": row.actor_email,
            "auth": row.auth, "project_id": row.project_id, "action": row.action,
            "resource": row.resource, "outcome": row.outcome, "reason": row.reason,
            "request_id": row.request_id, "client": row.client}


@dataclass(frozen=True)
class EventFilter:
    """What a reader asks for; `project_ids` None: every project's events and the server's."""

    project_ids: list[int] | None = None
    actor: str | None = None
    action: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def list_events(*, session: Session, where: EventFilter, cursor: str | None,
                limit: int) -> tuple[list[tuple[AuditEvent, str | None]], str | None]:
    """A page of events (each with its project's name), newest first, and the cursor of the
    next page (None at the end)."""
    statement = _filtered(select(AuditEvent, Project.name).outerjoin(
        Project, Project.id == AuditEvent.project_id), where)
    if cursor is not None:
        statement = statement.where(AuditEvent.id < decode_cursor(cursor))
    rows = [tuple(row) for row in session.execute(
        statement.order_by(AuditEvent.id.desc()).limit(limit + 1))]
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1][0].id) if more else None


def _filtered(statement: Select, where: EventFilter) -> Select:
    if where.since is not None and where.until is not None and where.since > where.until:
        raise InvalidInput("invalid_range", "since is after until")
    if where.project_ids is not None:
        statement = statement.where(AuditEvent.project_id.in_(where.project_ids))
    for column, value in ((AuditEvent.actor, where.actor), (AuditEvent.action, where.action),
                          (AuditEvent.outcome, where.outcome)):
        if value is not None:
            statement = statement.where(column == value)
    if where.since is not None:
        statement = statement.where(AuditEvent.created_at >= where.since)
    if where.until is not None:
        statement = statement.where(AuditEvent.created_at < where.until)
    return statement


def encode_cursor(last_id: int) -> str:
    """An opaque cursor: the page after it holds the events older than `last_id`."""
    return base64.urlsafe_b64encode(f"{CURSOR_PREFIX}{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The id a cursor of encode_cursor's points before; 422 invalid_cursor otherwise."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    number = text.removeprefix(CURSOR_PREFIX)
    if not text.startswith(CURSOR_PREFIX) or not number.isdecimal() or len(number) > 18:
        raise InvalidInput("invalid_cursor", "the cursor is not one this server gave")
    return int(number)
