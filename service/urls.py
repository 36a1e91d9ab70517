"""The addresses of the API's resources and the dashboard's pages: the one place a route's
path is written outside its router (tests/service/test_urls.py checks each against the app's
routes). Paths start at the server's root; `on` puts one under a base URL."""

from urllib.parse import quote, urlencode

UI = "/ui"  # the dashboard: its pages, its static files and the API docs' assets
UI_STATIC = f"{UI}/static"


def on(base_url: str, path: str) -> str:
    """`path` under `base_url` (which ends with "/")."""
    return base_url + path.removeprefix("/")


def job(job_id: int) -> str:
    """A job's state, progress and result."""
    return f"/jobs/{job_id}"


def version(line: str, name: str) -> str:
    """A model version."""
    return f"/models/{line}/versions/{name}"


def model(line: str, name: str) -> str:
    """A version's model file (or bundle), for a deploy job."""
    return f"{version(line, name)}/artifact"


def predictions(line: str, name: str) -> str:
    """Where a version's predictions are uploaded."""
    return f"{version(line, name)}/predictions"


def matrix(line: str, evalset: str) -> str:
    """A line's matrix of pair metrics on an eval set."""
    return f"/models/{line}/matrix?evalset={evalset}"


def compare(old: str, new: str, evalset: str, *, html: bool = False) -> str:
    """The report of the pair old → new ("line:version" each) on an eval set."""
    return f"/compare/{old}/{new}?evalset={evalset}" + ("&format=html" if html else "")


def disagreements(old: str, new: str, evalset: str, export_format: str = "json") -> str:
    """The export of the samples on which old and new disagree on a traffic set."""
    return f"/compare/{old}/{new}/disagreements?evalset={evalset}&format={export_format}"


def healthz() -> str:
    """The liveness probe."""
    return "/healthz"


def readyz() -> str:
    """The readiness probe."""
    return "/readyz"


def metrics() -> str:
    """The Prometheus figures (a token with the `metrics` scope)."""
    return "/metrics"


def gate() -> str:
    """The gate's webhook (a token, or a signature of the body)."""
    return "/gate"


def mlflow_webhook() -> str:
    """The MLflow connector's webhook (signed by MLflow)."""
    return "/integrations/mlflow/webhook"


def decision(decision_id: int) -> str:
    """A gate decision."""
    return f"/gate/decisions/{decision_id}"


def token(name: str) -> str:
    """A stored token of the caller's project (DELETE revokes it)."""
    return f"/tokens/{quote(name, safe='')}"


def ui_audit(**filters: str) -> str:
    """The dashboard's page of the audit trail."""
    return f"{UI}/audit" + (f"?{urlencode(filters)}" if filters else "")


def ui_home() -> str:
    """The dashboard's first page (the model lines)."""
    return UI


def ui_jobs() -> str:
    """The dashboard's page of jobs."""
    return f"{UI}/jobs"


def ui_signin(next: str | None = None, ended: str | None = None) -> str:
    """The dashboard's sign-in page (where its form posts): `next` is the page it leads to,
    `ended` why the last session ended."""
    query = {key: value for key, value in (("next", next), ("ended", ended)) if value}
    return f"{UI}/signin" + (f"?{urlencode(query, safe='', quote_via=quote)}" if query else "")


def ui_signout() -> str:
    """Where the dashboard's sign-out form posts."""
    return f"{UI}/signout"


def ui_static(name: str) -> str:
    """One of the dashboard's static files."""
    return f"{UI_STATIC}/{name}"


def _query(**values: str | None) -> str:
    """The query string of the `values` that are set ("" when none is)."""
    kept = {key: value for key, value in values.items() if value is not None}
    return f"?{urlencode(kept)}" if kept else ""


def ui_decision(decision_id: int, project: str | None = None) -> str:
    """The dashboard's page of a decision (in `project`: a link that opens whatever project
    its reader looked at last)."""
    return f"{UI}/decisions/{decision_id}{_query(project=project)}"


def ui_line(line: str, evalset: str | None = None, project: str | None = None) -> str:
    """The dashboard's page of a line (its matrix on `evalset`)."""
    return f"{UI}/lines/{quote(line, safe='')}{_query(evalset=evalset or None, project=project)}"


def _ui_pair_path(line: str, old: str, new: str) -> str:
    return f"{UI}/lines/{quote(line, safe='')}/pairs/{quote(old, safe='')}/{quote(new, safe='')}"


def ui_disagreements(line: str, old: str, new: str, evalset: str, export_format: str,
                     project: str | None = None) -> str:
    """The disagreements' export of a traffic pair, for a signed-in person."""
    return (f"{_ui_pair_path(line, old, new)}/disagreements"
            f"{_query(evalset=evalset, format=export_format, project=project)}")


def ui_pair(line: str, old: str, new: str, evalset: str | None,
            project: str | None = None) -> str:
    """The dashboard's page of the pair old → new of a line."""
    return f"{_ui_pair_path(line, old, new)}{_query(evalset=evalset or '', project=project)}"


def ui_oidc_start(next: str | None = None) -> str:
    """Where single sign-on starts (to the OpenID provider, then back to `next`)."""
    return f"{UI}/oidc/start" + (f"?{urlencode({'next': next})}" if next else "")


def ui_oidc_callback() -> str:
    """Where the OpenID provider sends the browser back (the redirect URI to register)."""
    return f"{UI}/oidc/callback"


def ui_tokens(project: str | None = None) -> str:
    """The dashboard's page where a signed-in person lists and mints personal API tokens."""
    return f"{UI}/tokens{_query(project=project)}"


def ui_revoke_token(token_id: int, project: str | None = None) -> str:
    """Where the dashboard's form that revokes a person's own token posts."""
    return f"{UI}/tokens/{token_id}/revoke{_query(project=project)}"
