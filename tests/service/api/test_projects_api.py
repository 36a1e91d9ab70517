"""Projects, their members and their tokens through the API (docs/access.md): the server
admin creates projects; two projects hold the same names side by side; a project's admin
grants roles and mints tokens in its own project only; a token of another project gets
exactly what a project that exists nowhere gets."""

from datetime import datetime, timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from httpx import Response

from service.auth.service import create_token
from service.db import utcnow
from tests.service.api.conftest import ADMIN_TOKEN, bearer, error_code, npy_bytes
from worker import tasks

ALL_SCOPES = ["admin", "gate", "read", "write"]
GRANT = {"group": "ml-team", "role": "viewer"}


@pytest.fixture
def projects(client) -> None:
    """The projects `a` and `b`, beside `default`."""
    for name in ("a", "b"):
        assert client.post("/projects", json={"name": name}).status_code == 201


@pytest.fixture
def minted(db):
    """Mints a token named after its scopes in a project; returns its plaintext."""

    def mint(project: str, *scopes: str) -> str:
        with db() as session:
            return create_token(session=session, name="-".join(scopes), scopes=list(scopes),
                                project=project)[1]

    return mint


def answer(response: Response, project: str) -> tuple[int, str]:
    """The status and body of an answer about `project`, its name in the body replaced (a
    project of none is compared under another name than the one it stands for)."""
    return response.status_code, response.text.replace(repr(project), "'P'")


def test_the_server_admin_creates_projects_with_unique_valid_names(client, minted):
    created = client.post("/projects", json={"name": "fraud-team"})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "fraud-team" and created.json()["scopes"] == ALL_SCOPES
    assert error_code(client.post("/projects", json={"name": "fraud-team"}), 409) == \
        "project_exists"
    assert error_code(client.post("/projects", json={"name": "a b"}), 422) == \
        "invalid_project_name"
    project_admin = bearer(minted("default", "admin"))
    assert error_code(client.post("/projects", json={"name": "c"}, headers=project_admin),
                      403) == "missing_scope"
    assert [p["name"] for p in client.get("/projects").json()] == ["default", "fraud-team"]


def test_a_caller_lists_the_projects_it_acts_in_with_its_scopes_there(client, projects,
                                                                       minted):
    everything = client.get("/projects").json()
    assert [(p["name"], p["scopes"]) for p in everything] == [
        ("a", ALL_SCOPES), ("b", ALL_SCOPES), ("default", ALL_SCOPES)]
    own = client.get("/projects", headers=bearer(minted("a", "read", "gate"))).json()
    assert [(p["name"], p["scopes"]) for p in own] == [("a", ["gate", "read"])]


def upload_line(client: TestClient, project: str, onnx: bytes, npz: bytes) -> None:
    """The eval set `holdout` and the version fraud:1.0 in `project`, as the server admin."""
    where = {"project": project}
    assert client.post("/evalsets", params=where, data={"name": "holdout"},
                       files={"data": ("holdout.npz", npz)}).status_code == 201
    assert client.post("/models", params=where, data={"name": "fraud", "version": "1.0"},
                       files={"artifact": ("model.onnx", onnx)}).status_code == 201


def test_two_projects_hold_the_same_line_and_eval_set_names_side_by_side(
        client, projects, minted, onnx_file, npz_file):
    for project, classes in (("a", 3), ("b", 4)):
        upload_line(client, project, onnx_file(classes).read_bytes(),
                    npz_file(n=10 * classes, num_classes=classes).read_bytes())
    for project, classes in (("a", 3), ("b", 4)):
        reader = bearer(minted(project, "read"))
        line = client.get("/models/fraud", headers=reader).json()["line"]
        assert line["num_classes"] == classes
        assert [s["n"] for s in client.get("/evalsets", headers=reader).json()] == [
            10 * classes]
        assert client.get("/models/fraud", params={"project": project}).json()["line"][
            "num_classes"] == classes  # the server admin names the project
    reader_of_a = bearer(minted("a", "read", "write"))
    assert answer(client.get("/models/fraud", params={"project": "b"}, headers=reader_of_a),
                  "b") == answer(client.get("/models/fraud", params={"project": "nowhere"},
                                            headers=reader_of_a), "nowhere")


def test_a_pair_is_measured_on_the_eval_set_of_its_own_project(client, projects, worker,
                                                               npz_file):
    """The metrics job reads the eval set `holdout` of its own project: each project's has
    another size."""
    for project, classes in (("a", 3), ("b", 4)):
        where = {"project": project}
        labels = np.arange(10 * classes) % classes
        client.post("/evalsets", params=where, data={"name": "holdout"}, files={"data": (
            "holdout.npz", npz_file(n=10 * classes, num_classes=classes).read_bytes())})
        for version in ("1.0", "1.1"):
            client.post("/models", params=where, data={
                "name": "fraud", "version": version, "num_classes": str(classes)})
            client.post(f"/models/fraud/versions/{version}/predictions", params=where,
                        data={"evalset": "holdout"},
                        files={"logits": ("logits.npy", npy_bytes(np.eye(classes)[labels]))})
        pair = ("/compare/fraud:1.0/fraud:1.1", {"evalset": "holdout", **where})
        tasks.metrics(client.post(pair[0], params=pair[1]).json()["job_id"])
        assert client.get(pair[0], params=pair[1]).json()["n"] == 10 * classes


def test_a_project_admin_grants_replaces_and_revokes_roles(client, projects, minted):
    client.headers.update(bearer(minted("a", "admin")))
    granted = client.put("/projects/a/members", json=GRANT)
    assert granted.json() == {"kind": "group", "principal": "ml-team", "role": "viewer"}
    client.put("/projects/a/members", json={"subject": "user-1", "role": "gatekeeper"})
    client.put("/projects/a/members", json={**GRANT, "role": "maintainer"})
    expected = [{"kind": "group", "principal": "ml-team", "role": "maintainer"},
                {"kind": "subject", "principal": "user-1", "role": "gatekeeper"}]
    assert client.get("/projects/a/members").json() == expected
    removed = client.request("DELETE", "/projects/a/members", json={"group": "ml-team"})
    assert removed.status_code == 204
    assert client.get("/projects/a/members").json() == expected[1:]
    assert error_code(client.request("DELETE", "/projects/a/members", json=GRANT), 404) == \
        "member_not_found"
    assert client.get("/projects/b/members",
                      headers=bearer(ADMIN_TOKEN)).json() == []


@pytest.mark.parametrize(("body", "code"), [
    ({"role": "viewer"}, "invalid_member"),
    ({"group": "g", "subject": "s", "role": "viewer"}, "invalid_member"),
    ({"group": "g", "role": "owner"}, "invalid_role"),
])
def test_a_grant_names_one_group_or_subject_and_a_known_role(client, projects, body, code):
    assert error_code(client.put("/projects/a/members", json=body), 422) == code
    assert error_code(client.request("DELETE", "/projects/a/members", json={}), 422) == \
        "invalid_member"


@pytest.mark.parametrize("scopes", [("read",), ("read", "write", "gate"), ("admin",)])
def test_another_projects_token_gets_what_a_project_of_none_gets(client, projects, minted,
                                                                  scopes):
    """The scope is checked first (403 for both), then the project (404 for both)."""
    headers = bearer(minted("b", *scopes))
    for method, body in (("GET", None), ("PUT", GRANT), ("DELETE", GRANT)):
        there = client.request(method, "/projects/a/members", json=body, headers=headers)
        nowhere = client.request(method, "/projects/nowhere/members", json=body,
                                 headers=headers)
        assert answer(there, "a") == answer(nowhere, "nowhere")
        assert there.status_code == (404 if "admin" in scopes else 403)
    assert client.get("/projects/a/members").json() == []


def test_a_project_member_without_admin_cannot_manage_members(client, projects, minted):
    writer = bearer(minted("a", "read", "write", "gate"))
    assert error_code(client.put("/projects/a/members", json=GRANT, headers=writer), 403) == \
        "missing_scope"


def test_a_project_admin_mints_tokens_of_its_scopes_for_its_project_only(client, projects,
                                                                         minted):
    client.headers.update(bearer(minted("a", "admin")))
    created = client.post("/tokens", json={"name": "ci", "scopes": ["read", "gate"],
                                           "expires_in_days": 30})
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["name"], body["project"], body["scopes"]) == ("ci", "a", ["gate", "read"])
    left = datetime.fromisoformat(body["expires_at"]) - utcnow()
    assert timedelta(days=30) - timedelta(minutes=1) < left <= timedelta(days=30)
    assert [(p["name"], p["scopes"]) for p in client.get(
        "/projects", headers=bearer(body["token"])).json()] == [("a", ["gate", "read"])]
    assert error_code(client.post("/tokens", json={"name": "m", "scopes": ["metrics"]}),
                      403) == "missing_scope"
    assert error_code(client.post("/tokens", json={"name": "s", "project": None,
                                                   "scopes": ["admin"]}), 403) == "missing_scope"
    assert error_code(client.post("/tokens", json={"name": "ci", "scopes": ["read"]}),
                      409) == "token_exists"
    elsewhere = [answer(client.post("/tokens", json={"name": "x", "project": project,
                                                     "scopes": ["read"]}), project)
                 for project in ("b", "nowhere")]
    assert elsewhere[0] == elsewhere[1] and elsewhere[0][0] == 404


def test_only_an_admin_mints_tokens(client, projects, minted):
    writer = bearer(minted("a", "read", "write", "gate"))
    assert error_code(client.post("/tokens", json={"name": "x", "scopes": ["read"]},
                                  headers=writer), 403) == "missing_scope"


def test_the_server_admin_mints_in_any_project_and_server_level_tokens(client, projects):
    def mint(body: dict, **params: str) -> dict:
        response = client.post("/tokens", json=body, params=params)
        assert response.status_code == 201, response.text
        return response.json()

    assert mint({"name": "ci", "scopes": ["read"]}, project="b")["project"] == "b"
    assert mint({"name": "ci", "project": "a", "scopes": ["read"]})["project"] == "a"
    assert mint({"name": "ci", "scopes": ["read"]})["project"] == "default"
    scraper = mint({"name": "scrape", "project": None, "scopes": ["metrics"]})
    assert scraper["project"] is None
    assert client.get("/projects", headers=bearer(scraper["token"])).json() == []
    assert error_code(client.post("/tokens", json={"name": "x", "project": None,
                                                   "scopes": ["read"]}), 422) == "invalid_scopes"
    for days in (0, 3651):
        assert error_code(client.post("/tokens", json={"name": "x", "scopes": ["read"],
                                                       "expires_in_days": days}), 422) == \
            "invalid_request"


def test_tokens_are_listed_and_revoked_within_the_acting_project(client, projects, minted):
    tokens = {project: client.post("/tokens", json={"name": "ci", "project": project,
                                                    "scopes": ["read"]}).json()["token"]
              for project in ("a", "b")}
    client.post("/tokens", json={"name": "only-b", "project": "b", "scopes": ["read"]})
    client.headers.update(bearer(minted("a", "admin")))
    listed = client.get("/tokens").json()
    assert [token["name"] for token in listed] == ["admin", "ci"]
    assert set(listed[0]) == {"name", "scopes", "created_at", "expires_at", "revoked_at"}
    assert client.delete("/tokens/ci").status_code == 204
    assert error_code(client.get("/models", headers=bearer(tokens["a"])), 401) == \
        "invalid_token"
    assert client.get("/models", headers=bearer(tokens["b"])).status_code == 200
    assert client.get("/tokens").json()[1]["revoked_at"] is not None
    assert error_code(client.delete("/tokens/only-b"), 404) == "token_not_found"
