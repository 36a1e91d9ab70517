"""The dashboard's page of the audit trail (GET /ui/audit): the events of the page's project
that GET /audit-events answers, newest first, filtered and paged the same way. Shown to
whoever holds `admin` in that project (the server admin holds it in every one); anyone else
gets a 403 page."""

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from service import urls
from service.audit.service import EventFilter, list_events
from service.auth.access import holds
from service.deps import CommittingRoute
from service.errors import InvalidInput, NotFound
from service.projects.service import get_project
from service.ui.pages import ReadSession, SignedIn, render, templates
from service.ui.session import Viewer

router = APIRouter(prefix=urls.UI, include_in_schema=False, route_class=CommittingRoute)
PER_PAGE = 50


def can_audit(who: Viewer | None) -> bool:
    """Whether the viewer may read the audit trail of the page's project (the header links to
    it then)."""
    return who is not None and holds(who.roles, who.project, "admin")


templates.env.globals["can_audit"] = can_audit


@router.get("/audit", response_class=HTMLResponse)
def audit(request: Request, who: SignedIn, session: ReadSession, actor: str | None = None,
          action: str | None = None, outcome: Literal["ok", "denied", ""] = "",
          cursor: str | None = None) -> HTMLResponse:
    """A page of events; its filters (an empty field: none) are kept in the next page's
    link."""
    if not can_audit(who):
        return render(request, "error.html", who, status=403, heading="Admins only",
                      message="The audit trail is shown to the project's admins.")
    filters = {key: value for key, value in (("actor", actor), ("action", action),
                                             ("outcome", outcome)) if value}
    try:
        ids = [get_project(session=session, name=who.project or "").id]
        rows, next_cursor = list_events(session=session, cursor=cursor, limit=PER_PAGE,
                                        where=EventFilter(project_ids=ids, actor=actor or None,
                                                          action=action or None,
                                                          outcome=outcome or None))
    except (NotFound, InvalidInput) as error:
        return render(request, "error.html", who, status=error.status_code,
                      heading="Not a valid filter", message=error.message)
    return render(request, "audit.html", who, rows=rows, filters=filters,
                  next_url=next_cursor and urls.ui_audit(**filters, cursor=next_cursor),
                  first_url=cursor and urls.ui_audit(**filters))
