"""The audit trail of the dashboard's people, read back through GET /audit-events: a person's
sign-in with OpenID Connect, the personal token they mint and the form's refusals are their
events (auth oidc); a refused callback is only logged; a sign-in with a revoked or expired
token is that token's `denied` event, as on the API. A personal token follows its owner's
grants: a grant removed or lowered through the API revokes the tokens whose scopes the
owner no longer holds, each an event of the admin who changed the grant."""

import logging
import re
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from service.auth.models import ApiToken
from service.auth.service import create_token, revoke_token
from service.db import utcnow
from service.projects.service import create_project, get_project, grant
from tests.service.api.conftest import ADMIN_TOKEN, bearer
from tests.ui.test_oidc import mint_form, settings, sign_in, start  # noqa: F401 (a fixture)

FIELDS = ("actor", "actor_email", "auth", "project", "action", "resource", "outcome",
          "reason")


def trail(client) -> list[tuple]:
    """Every event, newest first, as FIELDS."""
    answer = client.get("/audit-events", headers=bearer(ADMIN_TOKEN))
    assert answer.status_code == 200, answer.text
    return [tuple(event[field] for field in FIELDS) for event in answer.json()["events"]]


def member(db, subject: str, role: str, project: str = "default") -> None:
    with db() as session:
        if project != "default":
            create_project(session=session, name=project)
        grant(session=session, project=get_project(session=session, name=project),
              kind="subject", principal=subject, role=role)


SIGNED_IN = ("heidi", "heidi@example.com", "oidc", None, "sign_in", "/ui/oidc/callback",
             "ok", None)


def test_a_person_signs_in_and_mints_a_token_as_their_own_events(browser_client,
                                                                oidc_provider, db):
    member(db, "heidi", "maintainer", "vision")
    assert sign_in(browser_client, oidc_provider, "heidi",
                   email="heidi@example.com").status_code == 200
    assert trail(browser_client) == [SIGNED_IN]
    browser_client.get("/ui/tokens", params={"project": "vision"})
    minted = browser_client.post("/ui/tokens", data={
        "csrf": mint_form(browser_client), "read": "true", "write": "true"})
    assert minted.status_code == 200, minted.text
    assert trail(browser_client) == [
        ("heidi", "heidi@example.com", "oidc", "vision", "mint_personal_token", "/ui/tokens",
         "ok", None), SIGNED_IN]
    event = browser_client.get("/audit-events", params={"limit": 1},
                               headers=bearer(ADMIN_TOKEN)).json()["events"][0]
    assert event["details"] == {"method": "POST", "name": "person-heidi-1",
                                "scopes": ["read", "write"]}
    with db() as session:  # the caller the event names is no token of its own
        assert session.scalars(select(ApiToken.name)).all() == ["person-heidi-1"]


@pytest.mark.parametrize(("refusal", "reason"), [("scopes", "missing_scope"),
                                                 ("origin", "cross_site_request"),
                                                 ("csrf", "cross_site_request")])
def test_the_token_forms_refusals_are_the_persons_denied_events(browser_client,
                                                                oidc_provider, db, refusal,
                                                                reason):
    member(db, "judy", "viewer")
    sign_in(browser_client, oidc_provider, "judy", email="judy@example.com")
    csrf = mint_form(browser_client)
    answer = browser_client.post(
        "/ui/tokens", headers={"Origin": "http://evil.example"} if refusal == "origin" else {},
        data={"csrf": "0" * 64 if refusal == "csrf" else csrf, "read": "true"}
        | ({"write": "true"} if refusal == "scopes" else {}))
    assert answer.status_code == 403
    assert trail(browser_client)[0] == ("judy", "judy@example.com", "oidc", "default",
                                        "mint_personal_token", "/ui/tokens", "denied", reason)
    with db() as session:
        assert session.scalars(select(ApiToken).where(
            ApiToken.name.startswith("person-"))).all() == []


def test_a_refused_callback_is_logged_not_audited(browser_client, oidc_provider, caplog):
    oidc_provider.set_user("mallory", email="m@example.com")
    url, _flow = start(browser_client)
    forged = oidc_provider.authorize(url, "mallory").replace("state=", "state=forged")
    with caplog.at_level(logging.WARNING, logger="service.ui.people"):
        assert browser_client.get(forged, follow_redirects=False).status_code == 400
    assert "single sign-on refused (oidc_state_mismatch) from testclient" in caplog.text
    assert trail(browser_client) == []


@pytest.mark.parametrize("ending", ["revoked", "expired"])
def test_a_dashboard_sign_in_with_an_ended_token_is_its_denied_event(browser_client, db,
                                                                    ending):
    with db() as session:
        secret = create_token(session=session, name="ci", scopes=["read"])[1]
        if ending == "revoked":
            revoke_token(session=session, name="ci")
        else:
            session.execute(update(ApiToken).where(ApiToken.name == "ci")
                            .values(expires_at=utcnow() - timedelta(seconds=1)))
    for presented in (secret, "fg_unknown"):
        answer = browser_client.post("/ui/signin", data={"token": presented})
        assert answer.status_code == 401
    assert trail(browser_client) == [("ci", None, "token", "default", "sign_in", "/ui/signin",
                                      "denied", f"token_{ending}")]


def token_rows(page: str) -> dict[str, str]:
    """The tokens the page lists: {name: the row's HTML}."""
    table = page.split('id="tokens"')[1].split("</table>")[0] if 'id="tokens"' in page else ""
    return dict(re.findall(r'<tr data-token="([^"]+)">(.*?)</tr>', table, re.DOTALL))


def revoke_form(page: str, name: str) -> tuple[str, str]:
    """The address and CSRF token of the revoke button of the token `name`."""
    row = token_rows(page)[name]
    action = re.search(r'<form method="post" action="([^"]+)"', row).group(1)
    return action.replace("&amp;", "&"), re.search(r'name="csrf" value="([^"]+)"', row).group(1)


def without_token_ids(page: str) -> str:
    """`page` with each token id it names (`#7`, `/tokens/7/`) written N."""
    return re.sub(r"(#|/tokens/)\d+", r"\1N", page)


def test_a_person_lists_and_revokes_their_own_tokens_only(browser_client, oidc_provider, db):
    member(db, "heidi", "maintainer", "vision")
    member(db, "ivan", "maintainer", "default")
    with db() as session:  # a project admin's token named as a person's is not theirs
        create_token(session=session, name="person-heidi-9", scopes=["read"], project="vision")
    sign_in(browser_client, oidc_provider, "ivan", email="ivan@example.com")
    assert browser_client.post("/ui/tokens", data={
        "csrf": mint_form(browser_client), "read": "true"}).status_code == 200
    ivans = token_rows(browser_client.get("/ui/tokens").text)
    assert list(ivans) == ["person-ivan-1"]
    ivan_action = revoke_form(browser_client.get("/ui/tokens").text,
                              "person-ivan-1")[0].split("?")[0]
    sign_in(browser_client, oidc_provider, "heidi", email="heidi@example.com")
    browser_client.get("/ui/tokens", params={"project": "vision"})
    minted = browser_client.post("/ui/tokens", data={
        "csrf": mint_form(browser_client), "read": "true", "write": "true"})
    secret = minted.text.split('<code id="minted-token">')[1].split("<")[0]
    name = minted.text.split('<strong id="minted-name">')[1].split("<")[0]
    page = browser_client.get("/ui/tokens").text
    listed = token_rows(page)
    assert list(listed) == [name]  # not ivan's, not the admin's look-alike
    assert "vision" in listed[name] and "read, write" in listed[name]
    assert "active" in listed[name]
    _action, csrf = revoke_form(page, name)
    others = browser_client.post(ivan_action, data={"csrf": csrf})
    missing = browser_client.post("/ui/tokens/999999/revoke", data={"csrf": csrf})
    assert others.status_code == missing.status_code == 404
    assert without_token_ids(others.text) == without_token_ids(
        missing.text)  # another's token answers exactly as a missing one
    with db() as session:
        assert session.scalars(select(ApiToken.name).where(
            ApiToken.revoked_at.is_not(None))).all() == []
    assert trail(browser_client)[:2] == [
        ("heidi", "heidi@example.com", "oidc", "vision", "revoke_personal_token", resource,
         "denied", "token_not_found") for resource in ("/ui/tokens/999999/revoke", ivan_action)]
    action, csrf = revoke_form(page, name)
    assert browser_client.post(action, data={"csrf": csrf},
                               headers={"Origin": "http://evil.example"}).status_code == 403
    assert browser_client.get("/models", headers=bearer(secret)).status_code == 200
    revoked = browser_client.post(action, data={"csrf": csrf})
    assert revoked.status_code == 200 and "revoked" in token_rows(revoked.text)[name]
    assert "<form" not in token_rows(revoked.text)[name]
    assert trail(browser_client)[0] == (
        "heidi", "heidi@example.com", "oidc", "vision", "revoke_personal_token",
        action.split("?")[0], "ok", None)
    assert browser_client.get("/models", headers=bearer(secret)).status_code == 401


def test_the_no_project_page_does_not_link_back_to_itself(browser_client, oidc_provider):
    sign_in(browser_client, oidc_provider, "nobody")  # granted no role anywhere
    page = browser_client.get("/ui")
    assert page.status_code == 403 and "No project" in page.text
    main = page.text.split('<main id="main"')[1]
    assert 'href="/ui"' not in main and 'id="way-out"' in main


def mint_personal(client, provider, sub: str, project: str, *scopes: str,
                  groups: tuple[str, ...] = ()) -> str:
    """`sub` signs in (with `groups`) and mints a personal token with `scopes` in
    `project`: its secret."""
    sign_in(client, provider, sub, groups=list(groups))
    client.get("/ui/tokens", params={"project": project})
    minted = client.post("/ui/tokens", data={"csrf": mint_form(client)}
                         | {scope: "true" for scope in scopes})
    assert minted.status_code == 200, minted.text
    return minted.text.split('<code id="minted-token">')[1].split("<")[0]


def change_grant(client, method: str, project: str, **body) -> None:
    """The server admin puts or deletes a grant of `project` through the API."""
    answer = client.request(method, f"/projects/{project}/members", json=body,
                            headers=bearer(ADMIN_TOKEN))
    assert answer.is_success, answer.text


def status_with(client, secret: str) -> int:
    return client.get("/models", headers=bearer(secret)).status_code


def revocations(client) -> list[tuple]:
    """The (actor, auth, resource, reason, token name, owner) of each revocation of a
    personal token that a grant's change made (one with a reason), newest first."""
    answer = client.get("/audit-events", params={"action": "revoke_personal_token"},
                        headers=bearer(ADMIN_TOKEN))
    return [(event["actor"], event["auth"], event["resource"], event["reason"],
             event["details"]["name"], event["details"]["owner"])
            for event in answer.json()["events"] if event["reason"] is not None]


def test_a_personal_token_answers_401_once_its_owners_grant_is_removed(browser_client,
                                                                       oidc_provider, db):
    member(db, "heidi", "maintainer", "vision")
    secret = mint_personal(browser_client, oidc_provider, "heidi", "vision", "read", "write")
    ci = browser_client.post("/tokens", json={"name": "ci", "project": "vision",
                                              "scopes": ["read", "write"]},
                             headers=bearer(ADMIN_TOKEN)).json()["token"]  # owner NULL
    assert status_with(browser_client, secret) == status_with(browser_client, ci) == 200
    change_grant(browser_client, "DELETE", "vision", subject="heidi")
    assert [event[4:] for event in trail(browser_client)[:2]] == [
        ("revoke_member", "/projects/vision/members", "ok", None),
        ("revoke_personal_token", "/projects/vision/members", "ok", "grant_removed")]
    assert revocations(browser_client) == [("admin", "admin_token", "/projects/vision/members",
                                            "grant_removed", "person-heidi-1", "heidi")]
    assert status_with(browser_client, secret) == 401
    assert status_with(browser_client, ci) == 200


def test_a_lowered_role_revokes_the_tokens_with_scopes_it_no_longer_holds(browser_client,
                                                                          oidc_provider, db):
    member(db, "heidi", "maintainer", "vision")
    writer = mint_personal(browser_client, oidc_provider, "heidi", "vision", "read", "write")
    reader = mint_personal(browser_client, oidc_provider, "heidi", "vision", "read")
    change_grant(browser_client, "PUT", "vision", subject="heidi", role="viewer")
    assert status_with(browser_client, writer) == 401
    assert status_with(browser_client, reader) == 200
    assert revocations(browser_client) == [("admin", "admin_token", "/projects/vision/members",
                                            "role_lowered", "person-heidi-1", "heidi")]
    listed = token_rows(browser_client.get("/ui/tokens", params={"project": "vision"}).text)
    assert "revoked" in listed["person-heidi-1"] and "active" in listed["person-heidi-2"]


def test_a_removed_group_grant_revokes_only_the_tokens_no_other_grant_holds(browser_client,
                                                                            oidc_provider,
                                                                            db):
    with db() as session:
        vision = create_project(session=session, name="vision")
        grant(session=session, project=vision, kind="group", principal="ml-team",
              role="maintainer")
        grant(session=session, project=vision, kind="group", principal="ops", role="admin")
    alone = mint_personal(browser_client, oidc_provider, "alice", "vision", "read", "write",
                          groups=("ml-team",))
    held = mint_personal(browser_client, oidc_provider, "bob", "vision", "read", "write",
                         groups=("ml-team", "ops"))
    change_grant(browser_client, "DELETE", "vision", group="ml-team")
    assert status_with(browser_client, alone) == 401
    assert status_with(browser_client, held) == 200
    assert revocations(browser_client) == [("admin", "admin_token", "/projects/vision/members",
                                            "grant_removed", "person-alice-1", "alice")]
