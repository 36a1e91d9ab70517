"""The dashboard's page of the audit trail: whoever holds admin in the page's project reads
that project's events (filtered, paged; the server admin holds it in every project), anyone
else gets a refusal page and no link to it."""

import pytest

from service import urls
from service.auth.service import create_token
from service.projects.service import create_project
from service.ui import audit
from tests.service.api.conftest import ADMIN_TOKEN, bearer


@pytest.fixture
def trail(browser_client, mint) -> str:
    """One change (a policy) and one refusal (a reader's policy change); a reader's token."""
    reader = mint("read")
    assert browser_client.get("/models/none", headers=bearer(ADMIN_TOKEN)).status_code == 404
    assert browser_client.put("/models/none/policy", json={"max_nfr": 0.1},
                              headers=bearer(reader)).status_code == 403
    return reader


def sign_in(client, token: str) -> None:
    assert client.post(urls.ui_signin(), data={"token": token},
                       follow_redirects=False).status_code == 303


def test_the_server_admin_reads_the_trail_filtered_and_paged(browser_client, trail,
                                                            monkeypatch):
    sign_in(browser_client, ADMIN_TOKEN)
    page = browser_client.get(urls.ui_audit())
    assert page.status_code == 200 and 'href="/ui/audit"' in page.text
    assert "line_not_found" in page.text and "missing_scope" in page.text
    denied = browser_client.get(urls.ui_audit(outcome="denied", actor="read")).text
    assert "missing_scope" in denied and "line_not_found" not in denied
    monkeypatch.setattr(audit, "PER_PAGE", 1)
    first = browser_client.get(urls.ui_audit())
    older = first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
    second = browser_client.get(older.replace("&amp;", "&"))
    assert "missing_scope" in first.text and "line_not_found" not in first.text
    assert "line_not_found" in second.text and 'rel="next"' not in second.text
    assert browser_client.get(urls.ui_audit(cursor="bad")).status_code == 422
    assert browser_client.get(urls.ui_audit(project="nowhere")).status_code == 404


def test_other_viewers_get_no_trail_and_no_link(browser_client, trail):
    sign_in(browser_client, trail)
    assert 'href="/ui/audit"' not in browser_client.get(urls.ui_jobs()).text
    refused = browser_client.get(urls.ui_audit())
    assert refused.status_code == 403 and "missing_scope" not in refused.text


def test_a_projects_admin_reads_its_events_only(browser_client, trail, db):
    """An admin token of `vision` reads the token it minted there, not `default`'s trail; a
    reader of `vision` gets the refusal page."""
    with db() as session:
        create_project(session=session, name="vision")
        admin = create_token(session=session, name="vision-admin", scopes=["admin"],
                             project="vision")[1]
        reader = create_token(session=session, name="vision-reader", scopes=["read"],
                              project="vision")[1]
    assert browser_client.post("/tokens", json={"name": "vision-ci", "scopes": ["read"]},
                               headers=bearer(admin)).status_code == 201
    sign_in(browser_client, admin)
    page = browser_client.get(urls.ui_audit())
    assert page.status_code == 200 and "Audit trail of vision" in page.text
    assert "vision-admin" in page.text and "<code>mint_token</code>" in page.text
    assert "missing_scope" not in page.text and "line_not_found" not in page.text
    assert browser_client.get(urls.ui_audit(project="default")).status_code == 404
    browser_client.cookies.clear()
    sign_in(browser_client, reader)
    refused = browser_client.get(urls.ui_audit())
    assert refused.status_code == 403 and "vision-admin" not in refused.text
