"""The dashboard's pages for people: single sign-on with OpenID Connect (service.ui.oidc),
and the forms that write, where a signed-in person mints a personal API token for their
own roles in the project the page acts in (same origin, a token bound to the session, a
bounded expiry, shown once), and lists and revokes the tokens they minted.

A personal token holds its owner, the subject of the person who minted it (and their
groups then: service.auth.personal), so a person sees and revokes their own tokens only,
and nothing else can make a token theirs; it is revoked when a grant's change leaves its
owner without its scopes.
"""

import logging
import re
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import urls
from service.audit.requests import (
    SIGN_IN,
    add_event,
    client_of,
    record_change,
    record_page_refusal,
)
from service.auth.access import not_held
from service.auth.models import ApiToken
from service.auth.personal import REVOKE, owned_tokens, set_owner
from service.auth.service import SCOPES, create_token, revoke_token
from service.config import Settings
from service.db import session_scope, utcnow
from service.deps import Acting, CommittingRoute
from service.errors import ServiceError
from service.projects.models import Person
from service.projects.service import get_project
from service.ui import oidc
from service.ui.pages import (
    PageRefused,
    ReadSession,
    SignedIn,
    acting_viewer,
    cross_site,
    local,
    refused,
    render,
    same_origin,
    set_session,
)
from service.ui.session import Viewer, csrf_token, person_cookie

router = APIRouter(prefix=urls.UI, include_in_schema=False, route_class=CommittingRoute)
TOKEN_DAYS, MAX_TOKEN_DAYS = 30, 90  # a personal token's default and longest life
NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
CROSS_SITE, NOT_HELD = "cross_site_request", "missing_scope"  # the forms' refusals' reasons
NOT_OWNED = "token_not_found"  # a revocation of a token that is not the person's
MINT = "mint_personal_token"  # the action of a minted personal token's audit event
logger = logging.getLogger(__name__)


@router.get("/oidc/start")
def oidc_start(request: Request, next: str = urls.UI) -> Response:
    """Send the browser to the OpenID provider, keeping the flow's state in its own cookie
    (SameSite=Lax, so that the provider's cross-site redirect back carries it)."""
    settings = _sso_settings(request)
    started = oidc.start(settings, _redirect_uri(request, settings), local(next))
    response = RedirectResponse(started.url, status_code=303, headers=NO_STORE)
    response.set_cookie(oidc.FLOW_COOKIE, started.cookie, max_age=oidc.FLOW_SECONDS,
                        httponly=True, samesite="lax", secure=request.url.scheme == "https",
                        path=urls.ui_oidc_callback())
    return response


@router.get("/oidc/callback", response_class=HTMLResponse)
def oidc_callback(request: Request) -> Response:
    """Finish the sign-in the provider sent back: a refused one makes no session (400 with
    its code). The session cookie (SameSite=Strict) is set by a page of ours that then
    moves on: a browser does not send a Strict cookie on the redirects of a navigation
    that another site started.

    A sign-in is an `ok` audit event `sign_in` of the person, in the transaction that
    stores them. A refused one is only logged: its caller is not known (a forged state, a
    replayed code, an ID token for another client or expired: whatever subject it names is
    unproven), and an event would put a stranger's claim in the trail as a person's act."""
    settings = _sso_settings(request)
    cookie = request.cookies.get(oidc.FLOW_COOKIE)
    try:
        claims = oidc.finish(settings, _redirect_uri(request, settings), cookie,
                             dict(request.query_params))
        with session_scope(request.app.state.sessions) as session:
            person = oidc.upsert_person(session, settings, claims)
            add_event(session, request, oidc.caller(person), action=SIGN_IN)
    except ServiceError as error:
        logger.warning("single sign-on refused (%s) from %s", error.code, client_of(request))
        return _end_flow(render(request, "error.html", None, status=error.status_code,
                                heading="Sign-in refused", code=error.code,
                                message=error.message))
    page = render(request, "signed_in.html", None, next=local(oidc.flow_next(settings, cookie)
                                                              or urls.UI))
    return _end_flow(set_session(request, page, person_cookie(settings, person)))


@router.get("/tokens", response_class=HTMLResponse)
def tokens_page(request: Request, who: SignedIn, session: ReadSession) -> HTMLResponse:
    """The personal-token form and the person's own tokens, for a person signed in with
    single sign-on."""
    return _token_form(request, session, _person(who))


@router.post("/tokens", response_class=HTMLResponse, name=MINT)
def mint_personal_token(
        request: Request, csrf: Annotated[str, Form()] = "",
        read: Annotated[bool, Form()] = False, write: Annotated[bool, Form()] = False,
        gate: Annotated[bool, Form()] = False, admin: Annotated[bool, Form()] = False,
        expires_in_days: Annotated[int, Form(ge=1, le=MAX_TOKEN_DAYS)] = TOKEN_DAYS
        ) -> HTMLResponse:
    """Mint a personal API token bound to the page's project, with the scopes checked (each
    one the person holds there), expiring in 1 to MAX_TOKEN_DAYS days; its secret is shown
    this once. The token (its name and scopes) is an audit event of the person's in the
    project, in the transaction that stores it; a post from another site or session, or for
    scopes not held, a `denied` one."""
    scopes = [name for name, checked in (("read", read), ("write", write), ("gate", gate),
                                         ("admin", admin)) if checked]
    settings: Settings = request.app.state.settings
    with session_scope(request.app.state.sessions) as session:
        who = _person(acting_viewer(request, session))
        request.state.acting = _acting(session, who)
        if not same_origin(request, settings) or csrf != csrf_token(settings, who):
            record_page_refusal(request, session, CROSS_SITE)
            return cross_site(request)
        try:
            row, secret = _mint(session, who, scopes, expires_in_days)
        except PageRefused as error:
            record_page_refusal(request, session, NOT_HELD)
            return refused(request, error)
        except ServiceError as error:
            return _token_form(request, session, who, status=error.status_code,
                               code=error.code, error=error.message)
        request.state.audit_details = {"name": row.name, "scopes": row.scopes}
        record_change(request, session)
        response = _token_form(request, session, who, minted=row, secret=secret)
    response.headers.update(NO_STORE)
    return response


@router.post("/tokens/{token_id}/revoke", response_class=HTMLResponse, name=REVOKE)
def revoke_personal_token(request: Request, token_id: int,
                          csrf: Annotated[str, Form()] = "") -> HTMLResponse:
    """Revoke one of the person's own personal tokens, at once (its row stays, revoked); an
    `ok` audit event of the person's in the token's project, with the token's name, as
    DELETE /tokens/{name} writes. Another person's token, or none, answers 404 exactly
    alike (a `denied` event token_not_found); a post from another site or session 403."""
    settings: Settings = request.app.state.settings
    with session_scope(request.app.state.sessions) as session:
        who = _person(acting_viewer(request, session))
        owned = {row.id: (row, project) for row, project in owned_tokens(session, who.subject)}
        row, project = owned.get(token_id, (None, who.project))
        request.state.acting = _acting(session, who, project)
        if not same_origin(request, settings) or csrf != csrf_token(settings, who):
            record_page_refusal(request, session, CROSS_SITE)
            return cross_site(request)
        if row is None:
            record_page_refusal(request, session, NOT_OWNED, status=404)
            return refused(request, PageRefused(who, 404, f"You have no personal token "
                                                          f"#{token_id}.", heading="Not found"))
        revoke_token(session=session, name=row.name, project=project)
        request.state.audit_details = {"name": row.name}
        record_change(request, session)
        return _token_form(request, session, who, revoked=row)


def _acting(session: Session, who: Viewer, project_name: str | None = None) -> Acting:
    """A signed-in person as the caller in `project_name` (default: the page's project),
    for the audit trail (their subject, holding no token; the scopes they hold there)."""
    name = project_name or who.project
    project = get_project(session=session, name=name)
    return Acting(token=ApiToken(name=who.subject,
                                 scopes=sorted(who.roles.get(name, frozenset())),
                                 project_id=project.id),
                  project=project, auth=oidc.AUTH, email=who.email)


def _mint(session: Session, who: Viewer, scopes: list[str],
          days: int) -> tuple[ApiToken, str]:
    """A token for `who` in their page's project: 403 for scopes they do not hold there."""
    lacking = not_held(who.roles, who.project, scopes)
    if lacking:
        raise PageRefused(who, 403, f"you hold {sorted(who.roles[who.project])} in project "
                          f"{who.project!r}, not {sorted(lacking)}", heading="Scopes not held")
    prefix = f"person-{_slug(who.subject)}-"
    project = get_project(session=session, name=who.project)
    count = session.scalar(select(func.count()).select_from(ApiToken).where(
        ApiToken.project_id == project.id, ApiToken.name.startswith(prefix, autoescape=True)))
    row, secret = create_token(session=session, name=f"{prefix}{count + 1}", scopes=scopes,
                               project=who.project, expires_in=timedelta(days=days))
    set_owner(row, session.get_one(Person, who.subject))
    session.flush()
    return row, secret


def _token_form(request: Request, session: Session, who: Viewer, status: int = 200,
                **context) -> HTMLResponse:
    """The token page: the form that mints, and the person's own tokens (with the time now,
    to tell an active one from an expired one)."""
    settings: Settings = request.app.state.settings
    held = who.roles[who.project]
    return render(request, "tokens.html", who, status=status, nav="tokens",
                  scopes=[scope for scope in SCOPES if scope in held],
                  csrf=csrf_token(settings, who), days=TOKEN_DAYS, max_days=MAX_TOKEN_DAYS,
                  tokens=owned_tokens(session, who.subject), now=utcnow(), **context)


def _person(who: Viewer) -> Viewer:
    if who.subject is None:
        raise PageRefused(who, 403, "Personal tokens are for people signed in with single "
                          "sign-on; a token's holder has a token already.",
                          heading="Not a person")
    return who


def _slug(subject: str | None) -> str:
    """A subject as a token name's middle (letters, digits and . _ -, at most 60)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", subject or "")[:60].strip("-") or "x"


def _sso_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    if not oidc.enabled(settings):
        raise PageRefused(None, 404, "Single sign-on is not set up on this server "
                          "(FLIPGATE_OIDC_ISSUER).")
    return settings


def _redirect_uri(request: Request, settings: Settings) -> str:
    """Where the provider sends the browser back: under FLIPGATE_PUBLIC_URL, else this
    server's own address."""
    base = settings.public_url or str(request.base_url)
    return urls.on(base.rstrip("/") + "/", urls.ui_oidc_callback())


def _end_flow(response: Response) -> Response:
    """`response`, forgetting the flow's cookie (a flow is finished once)."""
    response.delete_cookie(oidc.FLOW_COOKIE, path=urls.ui_oidc_callback(), httponly=True,
                           samesite="lax")
    response.headers.update(NO_STORE)
    return response
