"""The dashboard's token sign-in, sign-out and read-only pages: server-rendered under /ui,
signed in with a session cookie.

Every page needs a session (else 303 to the sign-in page) and acts in one project of the
viewer's (service.ui.pages); the pages here only read. All this module writes is a failed
sign-in (the throttle's count, and a refused token's audit event) and the record of a
sign-out. Sign-in and sign-out refuse cross-site posts (Origin). Single sign-on and the forms
that mint, list and revoke personal API tokens are service.ui.people's pages.
"""

import functools
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

import numpy as np
from fastapi import APIRouter, FastAPI, Form, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from markupsafe import Markup
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from flipgate.reporting.gallery import GALLERY_CSS, IMAGE, gallery_html
from flipgate.reporting.html import stored_body, traffic_body
from flipgate.reporting.multilabel import worst_labels_first
from service import urls
from service.audit.requests import record_sign_in_refusal
from service.auth.service import TokenRefused
from service.compare.service import EXPORT_TYPES, resolve_pair, stored_export
from service.config import Settings
from service.datasets.labels import read_revision_labels
from service.datasets.service import read_label_matrix
from service.db import read_only, session_scope
from service.deps import CommittingRoute
from service.errors import Forbidden, NotFound, Unauthorized, describe_problems
from service.integrations.mlflow.service import list_events
from service.projects.models import DEFAULT_PROJECT
from service.storage import ArtifactStore
from service.ui import docs, oidc, people, queries, samples
from service.ui.curve import repair_curve_svg
from service.ui.heatmap import heatmap_svg
from service.ui.history import history_svg
from service.ui.pages import (
    PageRefused,
    ReadSession,
    SignedIn,
    cross_site,
    local,
    not_found,
    refused,
    render,
    same_origin,
    set_session,
)
from service.ui.session import (
    COOKIE,
    ENDED,
    SignInRequired,
    Viewer,
    record_failed_signin,
    sign_in,
    sign_out,
    signin_retry_after,
)

HERE = Path(__file__).parent
FLIPS_PER_PAGE = 48
router = APIRouter(prefix=urls.UI, include_in_schema=False, route_class=CommittingRoute)


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, next: str = urls.UI, ended: str = "") -> HTMLResponse:
    return signin_form(request, next, notice=ENDED.get(ended))


def signin_form(request: Request, next: str, status: int = 200, **context: Any) -> HTMLResponse:
    """The sign-in page: single sign-on where it is set up, and the token form."""
    return render(request, "signin.html", None, status=status, next=local(next),
                  sso=oidc.enabled(request.app.state.settings), **context)


@router.post("/signin", response_model=None)
def signin(request: Request, token: Annotated[str, Form()] = "",
           next: Annotated[str, Form()] = urls.UI) -> Response:
    """Exchange an API token (read scope) for a session cookie; failures are throttled per
    client address across every API process (429 with Retry-After), counted in the same
    transaction that checked the token (with a revoked or expired stored token's `denied`
    audit event, as the API writes for it)."""
    settings: Settings = request.app.state.settings
    if not same_origin(request, settings):
        return cross_site(request)
    client = request.client.host if request.client else ""
    with session_scope(request.app.state.sessions) as session:
        if wait := signin_retry_after(session=session, client=client):
            response = signin_form(request, next, status=429,
                                   error=f"Too many failed sign-ins; try again in {wait} s.")
            response.headers["Retry-After"] = str(wait)
            return response
        try:
            _viewer, cookie = sign_in(session, settings, token.strip())
        except (Unauthorized, Forbidden) as error:
            record_failed_signin(session=session, client=client)
            if isinstance(error, TokenRefused):
                record_sign_in_refusal(request, session, error)
            return signin_form(request, next, status=error.status_code, error=error.message)
    return set_session(request, RedirectResponse(local(next), status_code=303), cookie)


@router.post("/signout", response_model=None)
def signout(request: Request) -> Response:
    """End the session for good (its cookie no longer signs in, wherever it was copied)."""
    settings: Settings = request.app.state.settings
    if not same_origin(request, settings):
        return cross_site(request)
    with request.app.state.sessions.begin() as session:
        sign_out(session, settings, request.cookies.get(COOKIE))
    response = RedirectResponse(urls.ui_signin(ended="signed_out"), status_code=303)
    response.delete_cookie(COOKIE, path=urls.UI, httponly=True, samesite="strict")
    return response


@router.get("", response_class=HTMLResponse)
def lines(request: Request, who: SignedIn, session: ReadSession) -> HTMLResponse:
    return render(request, "lines.html", who, lines=queries.line_summaries(session))


HEATMAPS = {"nfr": "NFR", "churn": "churn"}
MULTILABEL_HEATMAPS = {"nfr": "NFR_sample", "churn": "churn_sample"}  # per sample


@router.get("/lines/{name}", response_class=HTMLResponse)
def line(request: Request, who: SignedIn, session: ReadSession, name: str,
         evalset: str | None = None, page: int = 1, versions: str = "",
         metric: Literal["nfr", "churn"] = "nfr") -> HTMLResponse:
    """A line's history, matrix heatmaps (the last versions, or all with versions=all: then
    one metric at a time when there are more; on a multi-label set NFR_sample and
    churn_sample), policies, promotions and decision log."""
    try:
        view = queries.line_page(session, name, evalset, page, whole_matrix=versions == "all")
    except NotFound as error:
        return line_not_found(request, who, name, error)
    pair_url = functools.partial(urls.ui_pair, name, evalset=view.evalset, project=who.project)
    shown = (list(HEATMAPS) if len(view.matrix.versions) <= queries.MATRIX_WINDOW
             else [metric])
    names = MULTILABEL_HEATMAPS if view.matrix.multilabel else HEATMAPS
    heatmaps = [(names[key], Markup(heatmap_svg(view.matrix, key, names[key],
                                                view.limits.get(key), pair_url)))
                for key in shown]
    return render(request, "line.html", who, view=view, heatmaps=heatmaps, metrics=shown,
                  metric_names=names,
                  history=Markup(history_svg(view.history, view.limits)),
                  reverts=list_events(session=session, model=name, action="reverted")
                  if who.project == DEFAULT_PROJECT else [])  # the connector's log names
    # lines, not projects: it is shown in the project the connector serves only


@router.get("/lines/{name}/pairs/{old}/{new}", response_class=HTMLResponse)
def pair(request: Request, who: SignedIn, session: ReadSession, name: str, old: str, new: str,
         evalset: str, page: int = 1) -> HTMLResponse:
    """The pair report and one page of its negative flips (on a multi-label set, its report's
    figures per sample and per label, and its negative flips by label; on multi-label
    traffic, the traffic report's sections and the disagreements' exports)."""
    store: ArtifactStore = request.app.state.store
    try:
        rows = queries.pair_rows(session, name, old, new, evalset)
    except NotFound as error:
        return counted_pair_page(request, who, session, (name, old, new, evalset), error)
    if rows.multilabel and rows.dataset.labeled:
        return render(request, "pair.html", who, rows=rows, name=name, evalset=evalset,
                      report=rows.metrics.report, labels=worst_labels_first(rows.metrics.report),
                      gallery=Markup(_label_gallery(rows, store)),
                      flips=rows.negative_flips, gallery_css=Markup(GALLERY_CSS))
    if rows.multilabel:  # traffic: the stored report's traffic sections, no gallery yet
        report = traffic_body(rows.metrics.report)
        gallery, page, pages, images = LABEL_TRAFFIC_GALLERY, 1, 1, False
    else:
        report = _report(rows, store)
        gallery, page, pages, images = _gallery(rows, store, page)
    return render(request, "pair.html", who, rows=rows, name=name, evalset=evalset,
                  report=Markup(report), gallery=Markup(gallery),
                  images=images, flips=rows.negative_flips, page=page,
                  exports=EXPORT_FORMATS if not rows.dataset.labeled else (),
                  pages=pages, per_page=FLIPS_PER_PAGE,
                  gallery_css=Markup(GALLERY_CSS))


@router.get("/lines/{name}/pairs/{old}/{new}/disagreements")
def disagreements(request: Request, who: SignedIn, session: ReadSession, name: str, old: str,
                  new: str, evalset: str,
                  export_format: Annotated[Literal["json", "csv", "label-studio"],
                                           Query(alias="format")] = "json") -> Response:
    """The disagreements' export of a pair on a traffic set (what the API's
    /compare/{old}/{new}/disagreements answers), for the decision page's links."""
    try:
        pair = resolve_pair(session=session, old=f"{name}:{old}", new=f"{name}:{new}",
                            evalset=evalset)
        exported = stored_export(session=session, store=request.app.state.store, pair=pair,
                                 export_format=export_format)
    except NotFound as error:
        return line_not_found(request, who, name, error)
    if exported is None:
        return not_found(request, who, NotFound("not_measured", f"{name}:{old} → {name}:{new} "
                                                f"is not measured on {evalset!r} yet"))
    filename = f"{name}-{old}-{new}-{evalset}-disagreements{EXPORT_SUFFIXES[export_format]}"
    return Response(exported, media_type=EXPORT_TYPES[export_format], headers={
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename, safe='')}"})


EXPORT_FORMATS = {"label-studio": "Label Studio tasks", "csv": "CSV", "json": "JSON"}
EXPORT_SUFFIXES = {"label-studio": "-label-studio.json", "csv": ".csv", "json": ".json"}


LABELS_ONLY_GALLERY = ('<p class="muted">A side of this pair is known by its predicted labels '
                       "only (an external version): its flipped samples are listed in the "
                       "report (flipped_indices); the gallery needs both models' scores.</p>")


LABEL_TRAFFIC_GALLERY = ('<p class="muted">The negative flips of a multi-label traffic set are '
                         "counted in the report above; they are not drawn here.</p>")


UNLABELLED_GALLERY = ('<p class="muted">No sample of this traffic set is known to flip yet: '
                      "a negative flip is known once its disagreement is labelled (label the "
                      "disagreements' export, linked above, in its order).</p>")


def _gallery(rows: queries.PairRows, store: ArtifactStore,
             page: int) -> tuple[str, int, int, bool]:
    """One page of the pair's negative flips (on a traffic set, those its labels make
    known), most confident first, as HTML; the page shown, the page count and whether the
    samples are pictures."""
    evalset = store.local_path(rows.dataset.sha256)
    view = samples.sample_view(evalset)
    if rows.old_logits is None or rows.new_logits is None:
        return LABELS_ONLY_GALLERY, 1, 1, view.kind == IMAGE
    paths = {"old_logits": store.local_path(rows.old_logits),
             "new_logits": store.local_path(rows.new_logits), "evalset": evalset}
    labels = _revision_labels(rows, store)
    negative = samples.negative_flips(rows.metrics.report, labels, paths["old_logits"],
                                      paths["new_logits"])
    if labels is not None and not negative.size:
        return UNLABELLED_GALLERY, 1, 1, view.kind == IMAGE
    ranked = samples.ranked_negative_flips(negative, paths["new_logits"])
    page, pages = queries.paged(page, len(ranked), FLIPS_PER_PAGE)
    flips = samples.gallery_page(ranked, page, FLIPS_PER_PAGE, **paths, view=view,
                                 class_names=rows.class_names, labels=labels)
    return gallery_html(flips, view, rows.class_names), page, pages, view.kind == IMAGE


NO_LABEL_FLIPS = '<p class="muted">No label of any sample turned wrong.</p>'


def _label_gallery(rows: queries.PairRows, store: ArtifactStore) -> str:
    """A multi-label pair's negative flips by label, as the library draws them for `flipgate
    compare --html` (the worst labels first, the most confident flips of each)."""
    if rows.old_logits is None or rows.new_logits is None:
        return LABELS_ONLY_GALLERY
    evalset = store.local_path(rows.dataset.sha256)
    return samples.multilabel_gallery(
        rows.metrics.report, old_probabilities=store.local_path(rows.old_logits),
        new_probabilities=store.local_path(rows.new_logits), evalset=evalset,
        y=read_label_matrix(store=store, dataset=rows.dataset),
        view=samples.sample_view(evalset)) or NO_LABEL_FLIPS


def _revision_labels(rows: queries.PairRows, store: ArtifactStore) -> np.ndarray | None:
    """The labels of the traffic set's revision that the report read (None on a labeled
    set)."""
    if rows.dataset.labeled:
        return None
    return read_revision_labels(store=store, labels=rows.labels, n=rows.dataset.n)


def line_not_found(request: Request, who: Viewer, name: str, error: NotFound) -> HTMLResponse:
    """The 404 page of a page of line `name`, offering the projects the viewer may see
    that hold a line of that name."""
    return not_found(request, who, error, unbound_read(
        request, lambda unbound: queries.projects_of_line(unbound, name)))


def unbound_read(request: Request, query: Callable[[Session], list[str]]) -> list[str]:
    """`query` run on a read-only session bound to no project (not_found then names only
    the projects the viewer may see)."""
    with request.app.state.sessions() as unbound:
        read_only(unbound)
        return query(unbound)


def counted_pair_page(request: Request, who: Viewer, session: Session,
                      pair: tuple[str, str, str, str], error: NotFound) -> HTMLResponse:
    """A pair without a full report: its counts from the matrix, and how to measure it."""
    if error.code != "pair_not_measured":
        return line_not_found(request, who, pair[0], error)
    try:
        counted = queries.counted_pair(session, *pair)
    except NotFound as missing:
        return line_not_found(request, who, pair[0], missing)
    name, _old, _new, evalset = pair
    return render(request, "counted.html", who, pair=counted, name=name, evalset=evalset)


def _report(rows: queries.PairRows, store: ArtifactStore) -> str:
    """The pair's report sections, cut from the page its metrics job drew and stored (the
    dashboard never computes a report)."""
    if rows.metrics.html_sha256 is not None:
        with store.open(rows.metrics.html_sha256) as readable:
            body = stored_body(readable.read().decode())
        if body is not None:
            return body
    return ('<p class="muted">This pair was measured before report pages were kept: its '
            "numbers are in the JSON report (GET /compare).</p>")


@router.get("/decisions/{decision_id}", response_class=HTMLResponse)
def decision(request: Request, who: SignedIn, session: ReadSession,
             decision_id: int) -> HTMLResponse:
    """A decision's verdict, reasons, metrics per eval set and repair."""
    try:
        view = queries.decision_page(session, decision_id)
    except NotFound as error:
        return not_found(request, who, error, unbound_read(
            request, lambda unbound: queries.projects_of_decision(unbound, decision_id)))
    choice = view.repair_choice
    curve = (Markup(repair_curve_svg(choice.curve, choice.share, choice.limits))
             if choice and choice.curve else None)
    return render(request, "decision.html", who, view=view, curve=curve)


@router.get("/jobs", response_class=HTMLResponse)
def jobs(request: Request, who: SignedIn, session: ReadSession, page: int = 1) -> HTMLResponse:
    """Open jobs, the latest failures and the finished jobs, a page at a time."""
    return render(request, "jobs.html", who, view=queries.jobs_page(session, who.project, page))


def to_signin(request: Request, error: SignInRequired) -> RedirectResponse:
    """Pages asked for without a session answer 303 to the sign-in page (which says why a
    session ended)."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(urls.ui_signin(next=target, ended=error.reason), status_code=303)


def home() -> RedirectResponse:
    return RedirectResponse(urls.ui_home(), status_code=303)


class DashboardGZip:
    """Compresses the dashboard's responses (its pages and static files); the API's are left
    as they are."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=1000)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        under_ui = scope["type"] == "http" and scope["path"].startswith(urls.UI)
        await (self.gzip if under_ui else self.app)(scope, receive, send)


def html_errors_under_ui(app: FastAPI) -> None:
    """Refusals of requests under /ui (unknown pages, ids that do not parse, missing
    parameters) answer an HTML page with the way back; the API keeps its JSON errors."""
    for kind in (RequestValidationError, HTTPException):
        app.add_exception_handler(kind, _ui_or(app.exception_handlers[kind]))


def _ui_or(api_handler: Callable[[Request, Exception], Response]
           ) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, error: Exception) -> Response:
        if not request.url.path.startswith(urls.UI):
            return api_handler(request, error)
        if isinstance(error, RequestValidationError):
            return render(request, "error.html", None, status=422, heading="Not a valid address",
                          message=describe_problems(error.errors()))
        status = getattr(error, "status_code", 500)
        return render(request, "error.html", None, status=status,
                      heading="Not found" if status == 404 else HTTPStatus(status).phrase,
                      message=f"There is no dashboard page at {request.url.path}."
                      if status == 404 else str(getattr(error, "detail", "")))
    return handle


def mount_dashboard(app: FastAPI) -> None:
    """Add the dashboard's pages, its static files and the offline /docs and /redoc; its
    responses compressed and its errors as HTML pages."""
    app.include_router(router)
    app.include_router(people.router)
    app.add_middleware(DashboardGZip)
    html_errors_under_ui(app)
    app.add_api_route("/", home, include_in_schema=False)
    app.mount(urls.UI_STATIC, StaticFiles(directory=HERE / "static"), name="ui-static")
    app.add_exception_handler(SignInRequired, to_signin)
    app.add_exception_handler(PageRefused, refused)
    docs.mount_docs(app)
