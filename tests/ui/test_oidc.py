"""Single sign-on against a real OpenID provider on loopback (tests/ui/oidc_provider.py),
driven with an HTTP client: the flow (PKCE S256, state, nonce), the four hostile answers
(a wrong state, a replayed code, an ID token of another client, an expired one) each
refused with no session made, the projects a person's grants give them page by page, and
the personal-token form. tests/ui/test_oidc_browser.py runs the flow in Chromium."""

import base64
import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from pydantic import SecretStr
from sqlalchemy import select

from service.audit.models import AuditEvent
from service.auth.models import ApiToken
from service.auth.service import create_token
from service.db import utcnow
from service.projects.models import Person
from service.projects.service import create_project, get_project, grant, revoke
from service.ui.oidc import FLOW_COOKIE
from service.ui.session import COOKIE
from tests.service.api.conftest import bearer, post_model, store_settings
from tests.service.conftest import write_onnx
from tests.ui.oidc_provider import CLIENT_ID, CLIENT_SECRET

ADMIN_GROUP = "flipgate-admins"


def sso_settings(settings, provider):
    return settings.model_copy(update={
        "oidc_issuer": provider.issuer, "oidc_client_id": CLIENT_ID,
        "oidc_client_secret": SecretStr(CLIENT_SECRET), "oidc_admin_group": ADMIN_GROUP})


@pytest.fixture
def settings(engine, tmp_path, oidc_provider):
    """The test app's settings, signing in with the suite's provider."""
    return sso_settings(store_settings(engine, tmp_path), oidc_provider)


def start(client, next_page="/ui"):
    """Start a sign-in: the provider's authorization address and the flow cookie's state."""
    started = client.get("/ui/oidc/start", params={"next": next_page}, follow_redirects=False)
    assert started.status_code == 303, started.text
    flow = started.cookies[FLOW_COOKIE]
    payload = json.loads(base64.urlsafe_b64decode(flow.partition(".")[0]))
    return started.headers["location"], payload


def sign_in(client, provider, sub, **claims):
    """The whole flow for `sub` with `claims`: the callback's answer."""
    provider.set_user(sub, **claims)
    url, _flow = start(client)
    return client.get(provider.authorize(url, sub), follow_redirects=False)


def person(db, sub):
    with db() as session:
        return session.get(Person, sub)


def assert_refused(answer, code, client, db, sub, sign_ins=0):
    """A refused callback: 400 with `code`, no session cookie, no person stored, no audit
    event but those of the `sign_ins` before it (an unproven caller is only logged)."""
    assert answer.status_code == 400, answer.text
    assert f'<code id="code">{code}</code>' in answer.text
    assert COOKIE not in answer.cookies
    assert client.get("/ui", follow_redirects=False).status_code == 303
    assert person(db, sub) is None
    with db() as session:
        assert session.scalars(select(AuditEvent.action)).all() == ["sign_in"] * sign_ins


def test_sign_in_runs_the_code_flow_with_pkce_state_and_nonce(browser_client, oidc_provider,
                                                             db):
    client = browser_client
    oidc_provider.set_user("alice", email="alice@example.com", name="Alice Liddell",
                           groups=["ml-team"])
    with db() as session:
        grant(session=session, project=get_project(session=session, name="default"),
              kind="group", principal="ml-team", role="viewer")
    url, flow = start(client, "/ui/jobs")
    query = {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}
    assert url.startswith(f"{oidc_provider.issuer}/oauth2/authorize")
    assert query["client_id"] == CLIENT_ID and query["response_type"] == "code"
    assert query["code_challenge_method"] == "S256"
    assert query["code_challenge"] == create_s256_code_challenge(flow["verifier"])
    assert (query["state"], query["nonce"]) == (flow["state"], flow["nonce"])
    answer = client.get(oidc_provider.authorize(url, "alice"), follow_redirects=False)
    assert answer.status_code == 200, answer.text
    assert 'http-equiv="refresh" content="0; url=/ui/jobs"' in answer.text
    set_cookies = answer.headers.get_list("set-cookie")
    session_cookie = next(line for line in set_cookies if line.startswith(f"{COOKIE}="))
    assert "HttpOnly" in session_cookie and "SameSite=strict" in session_cookie
    assert any(line.startswith(f'{FLOW_COOKIE}=""') for line in set_cookies)  # forgotten
    page = client.get("/ui/jobs")
    assert page.status_code == 200 and "Alice Liddell" in page.text
    stored = person(db, "alice")
    assert (stored.email, stored.groups) == ("alice@example.com", ["ml-team"])


def test_the_flow_cookie_is_lax_http_only_and_short_lived(browser_client):
    started = browser_client.get("/ui/oidc/start", follow_redirects=False)
    line = next(line for line in started.headers.get_list("set-cookie")
                if line.startswith(f"{FLOW_COOKIE}="))
    assert "HttpOnly" in line and "SameSite=lax" in line and "Max-Age=600" in line
    assert "Path=/ui/oidc/callback" in line


def test_a_wrong_state_is_refused(browser_client, oidc_provider, db):
    oidc_provider.set_user("mallory", email="m@example.com")
    url, _flow = start(browser_client)
    back = oidc_provider.authorize(url, "mallory")
    forged = back.replace("state=", "state=forged")
    answer = browser_client.get(forged, follow_redirects=False)
    assert_refused(answer, "oidc_state_mismatch", browser_client, db, "mallory")


def test_a_replayed_code_is_refused(browser_client, oidc_provider, db):
    oidc_provider.set_user("bob", email="bob@example.com")
    url, _flow = start(browser_client)
    flow_cookie = browser_client.cookies[FLOW_COOKIE]
    back = oidc_provider.authorize(url, "bob")
    assert browser_client.get(back, follow_redirects=False).status_code == 200
    with db() as session:
        session.delete(session.get(Person, "bob"))
    browser_client.cookies.clear()
    browser_client.cookies.set(FLOW_COOKIE, flow_cookie, path="/ui/oidc/callback")
    answer = browser_client.get(back, follow_redirects=False)
    assert_refused(answer, "oidc_code_refused", browser_client, db, "bob", sign_ins=1)


def test_an_id_token_issued_to_another_client_is_refused(browser_client, oidc_provider, db):
    oidc_provider.set_user("carol", email="carol@example.com")
    url, flow = start(browser_client)
    oidc_provider.id_token = oidc_provider.token_for_another_client(
        "carol", flow["nonce"], "another-client")
    try:
        answer = browser_client.get(oidc_provider.authorize(url, "carol"),
                                    follow_redirects=False)
    finally:
        oidc_provider.id_token = None
    assert_refused(answer, "oidc_invalid_id_token", browser_client, db, "carol")
    assert "aud" in answer.text


def test_an_expired_id_token_is_refused(browser_client, expired_oidc_provider, db):
    app_settings = browser_client.app.state.settings
    for key, value in sso_settings(app_settings, expired_oidc_provider):
        setattr(app_settings, key, value)
    answer = sign_in(browser_client, expired_oidc_provider, "dave", email="dave@example.com")
    assert_refused(answer, "oidc_invalid_id_token", browser_client, db, "dave")
    assert "expired" in answer.text


def test_a_group_grant_holds_before_sign_in_and_ends_with_its_revocation(browser_client,
                                                                        oidc_provider, db):
    client = browser_client
    with db() as session:
        vision = create_project(session=session, name="vision")
        grant(session=session, project=vision, kind="group", principal="cv-team", role="viewer")
    assert sign_in(client, oidc_provider, "erin", groups=["cv-team"]).status_code == 200
    page = client.get("/ui")
    assert page.status_code == 200
    assert '<option value="vision" selected>' in page.text
    assert '<option value="default"' not in page.text  # the switcher: their projects only
    missing = client.get("/ui", params={"project": "default"})
    assert missing.status_code == 404 and "no project named &#39;default&#39;" in missing.text
    with db() as session:
        revoke(session=session, project=get_project(session=session, name="vision"),
               kind="group", principal="cv-team")
    gone = client.get("/ui", params={"project": "vision"})
    assert gone.status_code == 404
    assert gone.text == client.get("/ui", params={"project": "nowhere"}).text.replace(
        "nowhere", "vision")
    assert client.get("/ui").status_code == 403  # no project left


def test_pages_of_another_project_answer_as_missing_ones(client, oidc_provider, db, tmp_path):
    with db() as session:
        create_project(session=session, name="vision")
    model = write_onnx(tmp_path, seed=1).read_bytes()
    assert client.post("/models", params={"project": "vision"},
                       data={"name": "detector", "version": "1"},
                       files={"artifact": ("model.onnx", model)}).status_code == 201
    assert post_model(client, "fraud", "1", model).status_code == 201
    client.headers.pop("Authorization")
    with db() as session:
        grant(session=session, project=get_project(session=session, name="default"),
              kind="subject", principal="frank", role="viewer")
    assert sign_in(client, oidc_provider, "frank").status_code == 200
    lines = client.get("/ui")
    assert "fraud" in lines.text and "detector" not in lines.text
    other = client.get("/ui/lines/detector")
    assert other.status_code == 404
    assert other.text == client.get("/ui/lines/nothing").text.replace("nothing", "detector")
    with db() as session:
        grant(session=session, project=get_project(session=session, name="vision"),
              kind="subject", principal="frank", role="viewer")
    assert client.get("/ui/lines/detector", params={"project": "vision"}).status_code == 200
    assert client.get("/ui/lines/fraud").status_code == 404  # vision is remembered


def test_a_member_of_the_admin_group_sees_every_project(browser_client, oidc_provider, db):
    with db() as session:
        create_project(session=session, name="vision")
    sign_in(browser_client, oidc_provider, "grace", groups=[ADMIN_GROUP])
    page = browser_client.get("/ui", params={"project": "vision"})
    assert page.status_code == 200
    assert '<option value="default"' in page.text and '<option value="vision"' in page.text


def mint_form(client):
    """The token form's CSRF token (the person's page)."""
    page = client.get("/ui/tokens")
    assert page.status_code == 200, page.text
    return page.text.split('name="csrf" value="')[1].split('"')[0]


def test_a_person_mints_a_token_with_their_own_scopes_in_the_project(browser_client,
                                                                    oidc_provider, db):
    client = browser_client
    with db() as session:
        grant(session=session, project=get_project(session=session, name="default"),
              kind="subject", principal="heidi@corp", role="maintainer")
    sign_in(client, oidc_provider, "heidi@corp")
    csrf = mint_form(client)
    held = client.post("/ui/tokens", data={"csrf": csrf, "read": "true", "gate": "true"})
    assert held.status_code == 403 and "Scopes not held" in held.text
    minted = client.post("/ui/tokens", params={"project": "default"},
                         data={"csrf": csrf, "read": "true", "write": "true",
                               "expires_in_days": "7"})
    assert minted.status_code == 200, minted.text
    assert minted.headers["cache-control"] == "no-store"
    secret = minted.text.split('<code id="minted-token">')[1].split("<")[0]
    with db() as session:
        row = session.scalars(select(ApiToken).where(ApiToken.name == "person-heidi-corp-1")
                              ).one()
        assert (row.scopes, row.project_id) == (["read", "write"], get_project(
            session=session, name="default").id)
        assert abs(row.expires_at - (utcnow() + timedelta(days=7))) < timedelta(minutes=1)
    assert client.get("/models", headers=bearer(secret)).status_code == 200
    refused = client.post("/gate", headers=bearer(secret), json={"model": "x", "candidate": "1"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "missing_scope"
    assert client.get("/models", headers=bearer(secret),
                      params={"project": "elsewhere"}).status_code == 404


@pytest.mark.parametrize("days", ["0", "91"])
def test_a_personal_token_expires_within_ninety_days(browser_client, oidc_provider, db, days):
    with db() as session:
        grant(session=session, project=get_project(session=session, name="default"),
              kind="subject", principal="ivan", role="viewer")
    sign_in(browser_client, oidc_provider, "ivan")
    answer = browser_client.post("/ui/tokens", data={"csrf": mint_form(browser_client),
                                                     "read": "true",
                                                     "expires_in_days": days})
    assert answer.status_code == 422


@pytest.mark.parametrize("forgery", ["origin", "csrf"])
def test_the_token_form_refuses_other_sites_and_other_sessions(browser_client, oidc_provider,
                                                               db, forgery):
    with db() as session:
        grant(session=session, project=get_project(session=session, name="default"),
              kind="subject", principal="judy", role="viewer")
    sign_in(browser_client, oidc_provider, "judy")
    csrf = mint_form(browser_client)
    headers = {"Origin": "http://evil.example"} if forgery == "origin" else {}
    answer = browser_client.post("/ui/tokens", headers=headers, data={
        "csrf": csrf if forgery == "origin" else "0" * 64, "read": "true"})
    assert answer.status_code == 403 and "Cross-site request refused" in answer.text
    with db() as session:
        assert session.scalars(select(ApiToken).where(
            ApiToken.name.startswith("person-"))).all() == []


def test_a_token_signed_viewer_mints_no_personal_token(browser_client, mint):
    signed = browser_client.post("/ui/signin", data={"token": mint("read")},
                                 follow_redirects=False)
    assert signed.status_code == 303
    assert browser_client.get("/ui/tokens").status_code == 403


def test_a_token_signed_viewer_sees_its_tokens_project_only(browser_client, db):
    with db() as session:
        create_project(session=session, name="vision")
        secret = create_token(session=session, name="cv-ci", scopes=["read"],
                              project="vision")[1]
    assert browser_client.post("/ui/signin", data={"token": secret},
                               follow_redirects=False).status_code == 303
    page = browser_client.get("/ui")
    assert '<option value="vision" selected>' in page.text
    assert '<option value="default"' not in page.text
    assert browser_client.get("/ui", params={"project": "default"}).status_code == 404
