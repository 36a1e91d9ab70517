"""Every address service.urls builds is served by a route of the app: renaming a route
without its builder fails here, not in a job's result or a callback's link."""

from urllib.parse import unquote, urlsplit

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Match

from service import urls
from service.config import Settings
from service.main import create_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("urls")
    return create_app(Settings(database_url=f"sqlite:///{folder / 'db.sqlite'}",
                               data_dir=folder / "data"))


@pytest.mark.parametrize(("method", "address"), [
    ("GET", urls.job(7)),
    ("GET", urls.version("digits", "1.0")),
    ("GET", urls.model("digits", "1.0")),
    ("POST", urls.predictions("digits", "1.0")),
    ("GET", urls.matrix("digits", "ev")),
    ("GET", urls.compare("digits:1.0", "digits:2.0", "ev", html=True)),
    ("GET", urls.decision(7)),
    ("GET", urls.healthz()),
    ("GET", urls.readyz()),
    ("GET", urls.metrics()),
    ("POST", urls.gate()),
    ("DELETE", urls.token("ci")),
    ("GET", urls.ui_audit(outcome="denied")),
    ("POST", urls.mlflow_webhook()),
    ("GET", urls.ui_home()),
    ("GET", urls.ui_jobs()),
    ("GET", urls.ui_signin(next=urls.ui_jobs(), ended="expired")),
    ("POST", urls.ui_signin()),
    ("POST", urls.ui_signout()),
    ("GET", urls.ui_decision(7)),
    ("GET", urls.ui_oidc_start(next=urls.ui_jobs())),
    ("GET", urls.ui_oidc_callback()),
    ("GET", urls.ui_tokens("default")),
    ("POST", urls.ui_tokens("default")),
    ("POST", urls.ui_revoke_token(7, "default")),
    ("GET", urls.ui_line("a line", "ev")),
    ("GET", urls.ui_pair("a line", "1.0", "2.0", "ev")),
    ("GET", urls.ui_disagreements("a line", "1.0", "2.0", "ev", "csv")),
    ("GET", urls.disagreements("l:1.0", "l:2.0", "ev")),
    ("GET", urls.on("https://gate.example/", urls.ui_decision(7))),
])
def test_each_built_address_is_a_route_of_the_app(app, method, address):
    path = unquote(urlsplit(address).path)
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    assert [route for route in app.routes if route.matches(scope)[0] == Match.FULL], address


def test_addresses_keep_their_shape():
    assert urls.compare("l:1", "l:2", "ev") == "/compare/l:1/l:2?evalset=ev"
    assert urls.on("https://gate.example/", urls.compare("l:1", "l:2", "ev", html=True)) == (
        "https://gate.example/compare/l:1/l:2?evalset=ev&format=html")
    assert urls.ui_line("a/b", "ev") == "/ui/lines/a%2Fb?evalset=ev"
    assert urls.ui_signin(next="/ui/lines/a b?evalset=ev", ended="expired") == (
        "/ui/signin?next=%2Fui%2Flines%2Fa%20b%3Fevalset%3Dev&ended=expired")


@pytest.mark.parametrize("name", ["dashboard.css", "favicon.svg"])
def test_the_dashboards_static_files_are_served(app, name):
    assert TestClient(app).get(urls.ui_static(name)).status_code == 200
