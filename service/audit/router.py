"""GET /audit-events: the audit trail, for the server admin (every project's) and for a
project's admins (their project's). Nothing updates or deletes an event."""

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import AwareDatetime
from sqlalchemy.orm import Session

from service.audit.schemas import AuditEventRead, AuditPage
from service.audit.service import EventFilter, list_events
from service.auth.access import is_server_admin
from service.auth.models import ApiToken
from service.deps import CommittingRoute, SessionDep, TokenDep, authorize
from service.names import NAME_LENGTH
from service.projects.service import get_project

router = APIRouter(tags=["audit"], route_class=CommittingRoute)
MAX_PAGE = 500
AuditedProject = Annotated[str | None, Query(
    max_length=NAME_LENGTH, description="only this project's events: the server admin's "
    "filter (default: every project's, and the server's own); a project's admin may name "
    "only their own")]


def audited_projects(request: Request, token: ApiToken, session: Session,
                     project: str | None) -> list[int] | None:
    """The projects whose events the caller reads: the server admin all (None) or the one it
    names; a project's admin its own (naming another: 404 project_not_found)."""
    if is_server_admin(token):
        return None if project is None else [get_project(session=session, name=project).id]
    return [authorize(request, session, token, project, "admin").project.id]


@router.get("/audit-events", response_model=AuditPage)
def read_audit_events(
        request: Request, token: TokenDep, session: SessionDep,
        project: AuditedProject = None,
        actor: Annotated[str | None, Query(max_length=255)] = None,
        action: Annotated[str | None, Query(max_length=NAME_LENGTH)] = None,
        outcome: Literal["ok", "denied"] | None = None,
        since: Annotated[AwareDatetime | None, Query(
            description="events at or after (ISO 8601 with its offset)")] = None,
        until: Annotated[AwareDatetime | None, Query(description="events before")] = None,
        cursor: Annotated[str | None, Query(max_length=64,
                                            description="a next_cursor of a page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> AuditPage:
    """The audit trail, newest first: every change (in the change's own transaction) and
    every refused request of a known caller. The server admin reads every project's events
    (`project` filters); a project's admin reads their project's."""
    where = EventFilter(project_ids=audited_projects(request, token, session, project),
                        actor=actor, action=action, outcome=outcome, since=since, until=until)
    rows, next_cursor = list_events(session=session, where=where, cursor=cursor, limit=limit)
    return AuditPage(events=[AuditEventRead.of(row, name) for row, name in rows],
                     next_cursor=next_cursor)
