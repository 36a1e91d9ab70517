"""What every dashboard page shares: the templates, the signed-in viewer and the project the
page acts in, and the refusals.

Each page acts in one project the viewer belongs to: the one its `?project=` names (kept in
a cookie for the pages after it), else the one chosen last, else `default` or the first the
viewer has. The page's session is bound to it (scope_session), so a line, decision or job of
another project answers exactly as a missing one; naming a project the viewer does not
belong to answers as naming none.
"""

import dataclasses
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode, urlsplit

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from service import urls
from service.auth.access import may_see
from service.config import Settings
from service.db import read_only
from service.errors import NotFound
from service.projects.models import DEFAULT_PROJECT
from service.projects.scoping import scope_session
from service.projects.service import ROLES, get_project, project_not_found
from service.ui import numbers
from service.ui.ci import ci_links
from service.ui.session import COOKIE, Viewer, max_age, viewer

HERE = Path(__file__).parent
PROJECT_COOKIE = "flipgate_project"  # the project chosen last (not a credential)
PROJECT_PARAM = "project"
templates = Jinja2Templates(directory=HERE / "templates")


def role_of(who: Viewer) -> str:
    """The viewer's role in the page's project ("admin", "viewer", …), or the scopes they
    hold there where no role holds exactly those (a token's)."""
    held = who.roles.get(who.project or "", frozenset())
    named = [role for role, scopes in ROLES.items() if scopes == held]
    return named[0] if named else "scopes " + ", ".join(sorted(held))


templates.env.globals.update(ci_links=ci_links, urls=urls, role_of=role_of, numbers=numbers)


class PageRefused(Exception):
    """A page that answers a refusal page (status, heading, message) to the viewer."""

    def __init__(self, who: Viewer | None, status: int, message: str,
                 heading: str | None = None) -> None:
        super().__init__(message)
        self.who, self.status, self.message, self.heading = who, status, message, heading


def read_session(request: Request) -> Iterator[Session]:
    """A session that only reads: on SQLite its transaction takes no write lock."""
    with request.app.state.sessions() as session:
        read_only(session)
        yield session


ReadSession = Annotated[Session, Depends(read_session)]


def signed_in(request: Request, session: ReadSession) -> Viewer:
    """The page's viewer (see acting_viewer), on the page's read-only session."""
    return acting_viewer(request, session)


def acting_viewer(request: Request, session: Session) -> Viewer:
    """The viewer of the request's session cookie (else SignInRequired: 303 to sign in), in
    the project the page acts in, to which `session` is bound."""
    who = viewer(session, request.app.state.settings, request.cookies.get(COOKIE))
    project = _chosen_project(request, who)
    scope_session(session, get_project(session=session, name=project).id)
    request.state.ui_project = project
    return dataclasses.replace(who, project=project)


SignedIn = Annotated[Viewer, Depends(signed_in)]


def _chosen_project(request: Request, who: Viewer) -> str:
    """The project a page acts in (see the module); PageRefused 404 for a named project the
    viewer does not belong to, 403 for a viewer who belongs to none."""
    named = request.query_params.get(PROJECT_PARAM)
    if named is not None and named not in who.roles:
        raise PageRefused(who, 404, project_not_found(named).message)
    remembered = request.cookies.get(PROJECT_COOKIE)
    for candidate in (named, remembered, DEFAULT_PROJECT):
        if candidate in who.roles:
            return candidate
    if not who.roles:
        raise PageRefused(who, 403, "You belong to no project yet: ask a project's admin to "
                          "grant a role to you or to one of your groups.", heading="No project")
    return min(who.roles)


def render(request: Request, template: str, who: Viewer | None, status: int = 200,
           **context: Any) -> HTMLResponse:
    """A page from `template` with the viewer (and the project switcher) in its header; a
    project named in the address is remembered for the next pages."""
    response = templates.TemplateResponse(
        request, template, {"viewer": who, "project": who.project if who else None, **context},
        status_code=status)
    chosen = getattr(request.state, "ui_project", None)
    if chosen is not None and request.query_params.get(PROJECT_PARAM) == chosen:
        response.set_cookie(PROJECT_COOKIE, chosen, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path=urls.UI)
    return response


def set_session(request: Request, response: Response, cookie: str) -> Response:
    """`response`, setting the session cookie (HttpOnly, SameSite=Strict, the dashboard's)."""
    response.set_cookie(COOKIE, cookie, max_age=max_age(request.app.state.settings),
                        httponly=True, samesite="strict", secure=request.url.scheme == "https",
                        path=urls.UI)
    return response


def refused(request: Request, error: PageRefused) -> HTMLResponse:
    return render(request, "error.html", error.who, status=error.status,
                  heading=error.heading, message=error.message)


def not_found(request: Request, who: Viewer, error: NotFound,
              owners: Collection[str] = ()) -> HTMLResponse:
    """The 404 page; where what was asked for is in other projects (`owners`) that the
    viewer may see, it offers to open it there (those the viewer may not see stay unnamed:
    the page is then exactly the one for a name of none)."""
    elsewhere = [name for name in sorted(owners)
                 if name != who.project and may_see(who.roles, name)]
    return render(request, "error.html", who, status=404, message=error.message,
                  elsewhere=[(name, _in_project(request, name)) for name in elsewhere])


def _in_project(request: Request, project: str) -> str:
    """The address of the request's page in `project`."""
    query = {**request.query_params, PROJECT_PARAM: project}
    return f"{request.url.path}?{urlencode(query)}"


def same_origin(request: Request, settings: Settings) -> bool:
    """Whether a post comes from the dashboard's own pages: its Origin (or Referer) names
    this server's host, or FLIPGATE_PUBLIC_URL's; a client that sends neither is no browser
    on another site (browsers send Origin with every cross-site post)."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return True
    own = {request.headers.get("host", ""), urlsplit(settings.public_url or "").netloc} - {""}
    try:
        return urlsplit(source).netloc in own
    except ValueError:  # not a URL (e.g. "http://["): no page of ours sent it
        return False


def cross_site(request: Request) -> HTMLResponse:
    return render(request, "error.html", None, status=403, heading="Cross-site request refused",
                  message="The dashboard accepts forms from its own pages only.")


def local(target: str) -> str:
    """`target` if it is a dashboard path, else the dashboard's home (no open redirects)."""
    return target if target.startswith(urls.UI) and "//" not in target else urls.UI
