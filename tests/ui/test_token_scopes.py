"""One token, one answer: the API (GET /projects) and a dashboard session signed in with the
same token give it the same projects and the same scopes in each (service.auth.access). A
project's `admin` token is its admin role and holds every project scope (docs/access.md)."""

from http.cookies import SimpleCookie

import pytest

from service.auth.service import create_token
from service.ui.session import COOKIE, viewer
from tests.service.api.conftest import ADMIN_TOKEN, bearer

EVERY_SCOPE = ["admin", "gate", "read", "write"]


@pytest.fixture
def other_project(browser_client) -> None:
    created = browser_client.post("/projects", json={"name": "other"}, headers=bearer(ADMIN_TOKEN))
    assert created.status_code == 201, created.text


def server_level_admin(db) -> str:
    with db() as session:
        return create_token(session=session, name="root", scopes=["admin"], project=None)[1]


@pytest.mark.parametrize(("holder", "expected"), [
    (lambda mint, db: mint("admin"), {"default": EVERY_SCOPE}),
    (lambda mint, db: mint("read", "gate"), {"default": ["gate", "read"]}),
    (lambda mint, db: mint("read", "write", "metrics"), {"default": ["read", "write"]}),
    (lambda mint, db: ADMIN_TOKEN, {"default": EVERY_SCOPE, "other": EVERY_SCOPE}),
    (lambda mint, db: server_level_admin(db), {"default": EVERY_SCOPE, "other": EVERY_SCOPE}),
], ids=["project-admin", "gatekeeper", "maintainer-with-metrics", "bootstrap-admin",
        "server-level-admin"])
def test_the_api_and_the_dashboard_give_a_token_the_same_scopes(
        browser_client, other_project, mint, db, holder, expected):
    token = holder(mint, db)
    listed = browser_client.get("/projects", headers=bearer(token))
    assert {project["name"]: project["scopes"] for project in listed.json()} == expected
    assert browser_client.post("/ui/signin", data={"token": token},
                               follow_redirects=False).status_code == 303
    cookie = SimpleCookie(f"{COOKIE}={browser_client.cookies[COOKIE]}")[COOKIE].value
    with db() as session:
        roles = viewer(session, browser_client.app.state.settings, cookie).roles
    assert {name: sorted(scopes) for name, scopes in roles.items()} == expected
