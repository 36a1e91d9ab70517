"""The audit trail over HTTP: a scripted session leaves exactly its events, newest first;
a change that fails leaves none; refusals of known callers are written, a flood of unknown
tokens is not; a project's admins see only its events; nothing can change an event."""

import json
import logging
from datetime import UTC, datetime, timedelta
from unittest.mock import ANY

import numpy as np
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select, update
from starlette.routing import Match

from flipgate.signing import signature
from service.audit.models import AuditEvent
from service.audit.requests import SAFE_METHODS
from service.auth.models import ApiToken
from service.auth.service import create_token, revoke_token
from service.db import utcnow
from service.deps import AdminAccess, SessionDep, TokenDep
from service.jobs.models import Job, JobKind, JobState
from service.main import ROUTERS
from service.projects.service import create_project
from tests.integrations.mlflow_world import alias_event, signed
from tests.service.api.conftest import (
    ADMIN_TOKEN,
    bearer,
    error_code,
    npy_bytes,
    post_model,
    run_task,
)
from tests.service.conftest import write_npz, write_onnx

N, CLASSES = 30, 3
FIELDS = ("actor", "auth", "project", "action", "outcome", "reason", "request_id")


def project_token(db, project: str, name: str, *scopes: str) -> str:
    """A token of `project` (created if it does not exist) with `scopes`."""
    with db() as session:
        if project != "default" and name.endswith("-ci"):
            create_project(session=session, name=project)
        return create_token(session=session, name=name, scopes=list(scopes),
                            project=project)[1]


@pytest.fixture
def other(db) -> str:
    """A read,write,gate token of a second project, `beta`."""
    return project_token(db, "beta", "beta-ci", "read", "write", "gate")


def events(client, token: str = ADMIN_TOKEN, **filters) -> list[dict]:
    response = client.get("/audit-events", params=filters, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()["events"]


def summary(found: list[dict]) -> list[tuple]:
    return [tuple(event[field] for field in FIELDS) for event in found]


def stored_events(client) -> int:
    with client.app.state.sessions() as session:
        return session.scalar(select(func.count()).select_from(AuditEvent))


def tagged(client, method: str, url: str, request_id: str, **kwargs):
    """A request with its own X-Request-ID."""
    headers = {"X-Request-ID": request_id, **kwargs.pop("headers", {})}
    return client.request(method, url, headers=headers, **kwargs)


def uploads(folder) -> list[tuple[str, str, dict]]:
    """An eval set, a version of `fraud` and its logits on it."""
    npz = write_npz(folder, n=N, num_classes=CLASSES).read_bytes()
    logits = np.random.default_rng(0).normal(size=(N, CLASSES))
    return [("POST", "/evalsets", {"data": {"name": "ev"}, "files": {"data": ("d.npz", npz)}}),
            ("POST", "/models", {"data": {"name": "fraud", "version": "1"},
                                 "files": {"artifact": ("m.onnx",
                                                        write_onnx(folder).read_bytes())}}),
            ("POST", "/models/fraud/versions/1/predictions",
             {"data": {"evalset": "ev"}, "files": {"logits": ("l.npy", npy_bytes(logits))}})]


def run(client, steps: list[tuple[str, str, dict]]) -> None:
    """Each step, tagged step-0, step-1, ...; each must succeed."""
    for number, (method, url, kwargs) in enumerate(steps):
        answer = tagged(client, method, url, f"step-{number}", **kwargs)
        assert answer.is_success, answer.text


def test_a_scripted_session_leaves_exactly_its_events_in_order(client, tmp_path, other):
    run(client, [*uploads(tmp_path),
                 ("POST", "/gate", {"json": {"model": "fraud", "candidate": "1"}}),
                 ("POST", "/models/fraud/aliases/production", {"json": {"version": "1"}}),
                 ("PUT", "/models/fraud/policy", {"json": {"max_nfr": 0.05}})])
    refused = tagged(client, "GET", "/models/fraud", "step-x", headers=bearer(other))
    assert error_code(refused, 404) == "line_not_found"
    assert client.get("/models/fraud").status_code == 200  # a read changes nothing
    assert client.post("/models/fraud/policy/dry-run", json={"max_nfr": 0.1}).is_success
    admin = [("admin", "admin_token", "default", action, "ok", None, f"step-{number}")
             for number, action in enumerate(["register_evalset", "register_version",
                                              "upload_predictions", "gate", "move_alias",
                                              "put_policy"])]
    denied = ("beta-ci", "token", "beta", "read_line", "denied", "line_not_found", "step-x")
    found = events(client)
    assert summary(found) == [denied, *reversed(admin)]
    assert [event["resource"] for event in found[:2]] == ["/models/fraud", "/models/fraud/policy"]
    assert {event["client"] for event in found} == {"testclient"}
    assert [event["id"] for event in found] == sorted((e["id"] for e in found), reverse=True)


def test_a_signed_gate_is_the_webhooks_in_its_project(client, tmp_path):
    run(client, uploads(tmp_path))
    secret = client.post("/models/fraud/webhook-secret").json()["secret"]
    body = json.dumps({"model": "fraud", "candidate": "1"}).encode()
    answer = client.post("/gate", content=body, headers={
        "Authorization": "", "Content-Type": "application/json",
        "X-Flipgate-Signature-256": signature(secret, body)})
    assert answer.is_success, answer.text
    wrong = client.post("/gate", content=body, headers={
        "Authorization": "", "Content-Type": "application/json",
        "X-Flipgate-Signature-256": signature("not-the-secret", body)})
    assert error_code(wrong, 401) == "invalid_signature"  # an unknown caller: nothing
    decision = answer.json()
    assert events(client, limit=1)[0]["details"] == {
        "method": "POST", "decision_id": decision["decision_id"], "verdict": decision["verdict"]}
    assert summary(events(client, limit=2)) == [
        ("webhook", "webhook", "default", "gate", "ok", None, answer.headers["X-Request-ID"]),
        ("admin", "admin_token", "default", "rotate_webhook_secret", "ok", None,
         events(client, limit=2)[1]["request_id"])]


def test_an_mlflow_alias_move_is_mlflows_event_in_the_connectors_project(client, other):
    """MLflow's signed delivery that queues a job is `mlflow`'s change (auth webhook) in
    FLIPGATE_MLFLOW_PROJECT; a duplicate, an ignored event and a bad signature write none."""
    settings = client.app.state.settings
    settings.mlflow_webhook_secret, settings.mlflow_project = SecretStr("mlflow-secret"), "beta"
    move = alias_event("fraud", "challenger", "2")
    queued = client.post("/integrations/mlflow/webhook", content=move,
                         headers=signed(move, secret="mlflow-secret") | {"Authorization": ""})
    assert queued.status_code == 202, queued.text
    for body, secret, delivery, status in (
            (move, "mlflow-secret", "d-1", 200),  # the same delivery again
            (alias_event("fraud", "other", "2"), "mlflow-secret", "d-2", 200),  # ignored
            (move, "not-the-secret", "d-3", 401)):
        assert client.post("/integrations/mlflow/webhook", content=body, headers=signed(
            body, secret=secret, delivery=delivery) | {"Authorization": ""}
        ).status_code == status
    found = events(client)
    assert summary(found) == [("mlflow", "webhook", "beta", "mlflow_webhook", "ok", None,
                               queued.headers["X-Request-ID"])]
    assert found[0]["details"] == {"method": "POST", "delivery_id": "d-1",
                                   "job_id": queued.json()["job_id"], "model": "fraud",
                                   "alias": "challenger", "version": "2"}


def queued_jobs(db) -> list[int]:
    with db() as session:
        return list(session.scalars(select(Job.id).where(Job.state == JobState.QUEUED)
                                    .order_by(Job.id)))


def test_a_measurement_asked_for_again_writes_no_event(client, db, tmp_path):
    """POST /compare is a change when it queues jobs; asked again while they are open, or
    once the report is stored, it changes nothing; so does POST .../matrix while the matrix
    job the new logits queued waits, and once the matrix is complete."""
    run(client, uploads(tmp_path)[:2])
    assert post_model(client, "fraud", "2",
                      write_onnx(tmp_path, CLASSES, seed=2).read_bytes()).status_code == 201
    compare, matrix = "/compare/fraud:1/fraud:2", "/models/fraud/matrix"
    asked = [tagged(client, "POST", compare, f"compare-{number}", params={"evalset": "ev"})
             for number in range(2)]
    assert [answer.status_code for answer in asked] == [202, 202]
    for job_id in asked[0].json()["job_ids"]:
        run_task(client, job_id)
    assert tagged(client, "POST", matrix, "matrix-0", params={"evalset": "ev"}
                  ).status_code == 202  # the matrix job the logits queued, still queued
    for job_id in queued_jobs(db):
        run_task(client, job_id)
    assert tagged(client, "POST", matrix, "matrix-1", params={"evalset": "ev"}
                  ).status_code == 200
    assert tagged(client, "POST", compare, "compare-2", params={"evalset": "ev"}
                  ).status_code == 200
    assert [(event["action"], event["request_id"]) for event in events(client, limit=1)] == [
        ("measure", "compare-0")]


def test_a_decision_settled_by_its_measurement_is_the_jobs_event(client, db, tmp_path):
    """The metrics job that ends a pending decision's wait settles it: its event has the job
    as actor (auth `job`) and the id of the request that queued the job, POST /gate."""
    run(client, uploads(tmp_path)[:2])
    assert post_model(client, "fraud", "2",
                      write_onnx(tmp_path, CLASSES, seed=2).read_bytes()).status_code == 201
    run(client, [("POST", "/gate", {"json": {"model": "fraud", "candidate": "1"}}),
                 ("POST", "/models/fraud/aliases/production", {"json": {"version": "1"}}),
                 ("PUT", "/models/fraud/policy", {"json": {"max_nfr": 0.5,
                                                           "evalsets": ["ev"]}})])
    asked = tagged(client, "POST", "/gate", "gate-2", json={"model": "fraud", "candidate": "2"})
    assert asked.status_code == 202, asked.text
    decision_id = asked.json()["decision_id"]
    for job_id in queued_jobs(db):  # the inference of each version, then the pair's metrics
        run_task(client, job_id)
    final = client.get(f"/gate/decisions/{decision_id}").json()
    assert final["verdict"] != "pending"
    with db() as session:
        metrics_job = session.scalar(select(Job.id).where(Job.kind == JobKind.METRICS))
    (settled,) = events(client, action="settle_decision")
    assert summary([settled]) == [(f"job {metrics_job}", "job", "default", "settle_decision",
                                   "ok", None, "gate-2")]
    assert settled["resource"] == f"/gate/decisions/{decision_id}"
    assert settled["details"] == {"job_id": metrics_job, "kind": "metrics",
                                  "decision_id": decision_id, "verdict": final["verdict"]}


def test_a_change_that_fails_writes_no_event(client, tmp_path):
    run(client, uploads(tmp_path)[:2])
    before = stored_events(client)
    again = client.post("/models", data={"name": "fraud", "version": "1"},
                        files={"artifact": ("m.onnx", write_onnx(tmp_path).read_bytes())})
    assert again.status_code == 409
    assert client.put("/models/fraud/policy", json={"max_nfr": 2}).status_code == 422
    assert client.post("/models/fraud/aliases/production",
                       json={"version": "1"}).status_code == 409  # no approving decision
    assert stored_events(client) == before
    assert [event["outcome"] for event in events(client)] == ["ok", "ok"]


def test_a_flood_of_unknown_tokens_writes_nothing(client):
    before = stored_events(client)
    for number in range(50):
        answer = client.get("/models", headers=bearer(f"fg_garbage{number}"))
        assert error_code(answer, 401) == "invalid_token"
    assert stored_events(client) == before


@pytest.mark.parametrize("ending", ["revoked", "expired"])
def test_a_revoked_or_expired_token_writes_a_denied_event(client, db, ending):
    token = project_token(db, "default", "ci", "read")
    with db() as session:
        if ending == "revoked":
            revoke_token(session=session, name="ci")
        else:
            session.execute(update(ApiToken).where(ApiToken.name == "ci")
                            .values(expires_at=utcnow() - timedelta(seconds=1)))
    answer = client.get("/models", headers=bearer(token) | {"X-Request-ID": "r-1"})
    assert error_code(answer, 401) == ("invalid_token" if ending == "revoked"
                                       else "token_expired")
    assert summary(events(client)) == [("ci", "token", "default", "authenticate", "denied",
                                        f"token_{ending}", "r-1")]


def test_a_missing_scope_is_denied(client, db):
    reader = project_token(db, "default", "reader", "read")
    answer = client.put("/models/fraud/policy", json={"max_nfr": 0.1}, headers=bearer(reader))
    assert error_code(answer, 403) == "missing_scope"
    assert summary(events(client))[0][:6] == ("reader", "token", "default", "put_policy",
                                              "denied", "missing_scope")


def test_each_event_is_one_log_line_once_committed(client, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="flipgate.audit"):
        run(client, uploads(tmp_path)[:1])
        client.post("/evalsets", data={"name": "ev"},
                    files={"data": ("d.npz", write_npz(tmp_path).read_bytes())})  # 409
    lines = [record.audit for record in caplog.records if record.name == "flipgate.audit"]
    stored = events(client)[0]
    assert lines == [{key: stored[key] for key in ("id", "actor", "actor_email", "auth",
                                                    "action", "resource", "outcome",
                                                    "reason", "request_id", "client")}
                     | {"project_id": lines[0]["project_id"]}]


@pytest.fixture
def two_projects(client, db, other) -> dict[str, str]:
    """Events in `default` (a refusal of a default reader) and in `beta` (refused reads of
    its tokens); admins of each project and the reader."""
    tokens = {"beta": project_token(db, "beta", "beta-admin", "admin"),
              "default": project_token(db, "default", "default-admin", "admin"),
              "reader": project_token(db, "default", "reader", "read")}
    assert client.post("/models/fraud/aliases/x", json={"version": "1"},
                       headers=bearer(tokens["reader"])).status_code == 403
    assert client.get("/models/nothing", headers=bearer(other)).status_code == 404
    assert client.get("/models/nothing", headers=bearer(tokens["beta"])).status_code == 404
    return tokens


def test_a_project_admin_sees_only_its_projects_events(client, two_projects):
    beta = events(client, two_projects["beta"])
    assert [(event["actor"], event["project"]) for event in beta] == [
        ("beta-admin", "beta"), ("beta-ci", "beta")]
    assert {event["project"] for event in events(client, two_projects["default"])} == {
        "default"}
    assert events(client, two_projects["beta"], project="beta") == beta
    hidden = client.get("/audit-events", params={"project": "default"},
                        headers=bearer(two_projects["beta"]))
    missing = client.get("/audit-events", params={"project": "nowhere"},
                         headers=bearer(two_projects["beta"]))
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == missing.json() | {"error": {
        "code": "project_not_found", "message": "no project named 'default'"}}
    refused = client.get("/audit-events", headers=bearer(two_projects["reader"]))
    assert error_code(refused, 403) == "missing_scope"


def test_the_server_admin_sees_every_project_and_filters(client, two_projects):
    everything = events(client)
    assert {event["project"] for event in everything} == {"default", "beta"}
    assert [event["project"] for event in events(client, project="beta")] == ["beta"] * len(
        events(client, project="beta"))
    assert {event["actor"] for event in events(client, actor="reader")} == {"reader"}
    assert {event["action"] for event in events(client, action="read_line")} == {"read_line"}
    assert {event["outcome"] for event in events(client, outcome="denied")} == {"denied"}
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert events(client, since=future) == []
    assert events(client, until=future) == everything
    assert error_code(client.get("/audit-events", params={"project": "nowhere"}),
                      404) == "project_not_found"


def test_pages_follow_the_cursor_newest_first(client, two_projects):
    everything = events(client)
    pages, cursor = [], None
    while not pages or cursor is not None:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/audit-events", params=params).json()
        pages.append(page["events"])
        cursor = page["next_cursor"]
    assert [len(page) for page in pages] == [2, 1]
    assert [event for page in pages for event in page] == everything


@pytest.mark.parametrize("params, code", [
    ({"cursor": "not-a-cursor"}, "invalid_cursor"),
    ({"cursor": "YmVmb3JlOi0x"}, "invalid_cursor"),  # "before:-1"
    ({"outcome": "maybe"}, "invalid_request"),
    ({"since": "yesterday"}, "invalid_request"),
    ({"since": "2026-01-01T00:00:00"}, "invalid_request"),  # no offset
    ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "invalid_range"),
    ({"limit": 0}, "invalid_request"),
    ({"limit": 501}, "invalid_request"),
])
def test_bad_filters_are_422(client, params, code):
    assert error_code(client.get("/audit-events", params=params), 422) == code


def test_no_route_changes_an_event(client):
    """Whatever path under /audit-events, only GET (and HEAD) reach a route."""
    for path in ("/audit-events", "/audit-events/1", "/audit-events/1/x"):
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            scope = {"type": "http", "method": method, "path": path, "root_path": ""}
            assert not [route for route in client.app.routes
                        if route.matches(scope)[0] == Match.FULL], (method, path)
    assert client.delete("/audit-events").status_code == 405


def test_a_route_added_later_is_audited_with_nothing_but_its_route_class(client, other):
    """A new route that changes something (as POST /projects, a membership, POST /tokens)
    writes its event from the route class and the caller: a synchronous endpoint through
    CommittingRoute, a coroutine through the request's session; a server-level one (no
    acting project) under the token's own project (none for the server admin). One that
    writes no row writes no event."""

    def change_in_project(acting: AdminAccess, session: SessionDep) -> dict:
        create_token(session=session, name="scratch", scopes=["read"],
                     project=acting.project.name)
        return {"project": acting.project.name}

    async def change_on_server(session: SessionDep, token: TokenDep) -> dict:
        create_project(session=session, name="scratch")
        return {"token": token.name}

    def change_nothing(acting: AdminAccess) -> dict:
        return {"project": acting.project.name}

    client.app.add_api_route("/scratch/{name}", change_in_project, methods=["PUT"])
    client.app.add_api_route("/scratch", change_on_server, methods=["POST"])
    client.app.add_api_route("/scratch/nothing", change_nothing, methods=["POST"])
    assert client.put("/scratch/a", params={"project": "beta"}).is_success
    assert client.post("/scratch").is_success
    assert client.post("/scratch/nothing").is_success  # wrote no row: no event
    assert summary(events(client)) == [
        ("admin", "admin_token", None, "change_on_server", "ok", None, ANY),
        ("admin", "admin_token", "beta", "change_in_project", "ok", None, ANY)]


def test_every_route_of_a_non_safe_method_is_audited():
    """A change needs no listing: what a route of POST, PUT, PATCH or DELETE writes is an
    event (and a dry run, which writes nothing, none: the scripted session above)."""
    routes = [route for router in ROUTERS for route in router.routes
              if set(route.methods) - SAFE_METHODS]
    assert all(route.audited for route in routes)
    assert len(routes) > 20
