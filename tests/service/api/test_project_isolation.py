"""Nothing leaks across projects, tested as an attacker would: every route of the app (read
from the app's own routes, so that a new one fails `test_every_route_is_in_the_table` until
it is listed here) × project B's tokens of every scope, each request naming an object of
project A answering exactly what the same token gets for a name that exists in no project,
and changing the database (every table but the audit trail) exactly as that request does:
the same rows changed or removed, as many added to each table; the audit events the two
requests write have the same actions, outcomes and reasons (B's admin reads B's trail: it
must not tell which names exist in A either). PROBES says how each route names A's objects
(several ways for most: A's line, A's version of the shared line `fraud`, A's eval set
beside B's line, A's project, A's token ...), and each route that acts in a project is
asked once more on B's own objects with `?project=default`. The dashboard's pages
(UI_PROBES) are asked the same way by people signed in with B's read token and with B's
token of every scope. A route added as a future one might be written, loading a row of
any project-owned table (versions among them) by its raw id with no check of its own,
answers B for A's rows exactly as for an id of none.

Projects `default` (A) and `beta` (B) each hold a line `fraud` (versions 1 and 2 with logits
on `holdout`, 1 in production, a policy, a webhook secret, a blocked decision and its repair
job), eval sets `holdout`, `cal`, the traffic set `traffic` and the training set `train`.
Only A holds version 3 of `fraud`, a second policy version, the line `only-a`, the eval set
`only-a-set`, the traffic set `only-a-traffic`, the training set `only-a-train`, the token
`ci-a`, the group `a-ops` (a viewer; B's viewers are `b-ops`) and an MLflow connector event
on `only-a`.
"""

import itertools
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import APIRouter
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from httpx import Response
from pydantic import SecretStr
from sqlalchemy import func, select, text

from flipgate.signing import HEADER, signature
from service.audit.models import AuditEvent
from service.auth.service import create_token
from service.db import Base, session_scope
from service.deps import CommittingRoute, SessionDep, require
from service.errors import NotFound
from service.integrations.mlflow.models import MlflowEvent
from service.jobs.models import Job
from service.projects.models import ProjectOwned
from service.projects.service import create_project, get_project, grant
from tests.integrations.mlflow_world import alias_event, signed
from tests.service.api.conftest import (
    bearer,
    measure,
    npy_bytes,
    post_evalset,
    post_logits,
    post_model,
    shared_store,
)
from tests.service.api.test_gate_api import CLASSES, N, logits_wrong_on
from tests.service.conftest import FEATURES, write_npz, write_onnx
from worker.sweeper import reconcile_mlflow

A, B = "default", "beta"
SCOPES = [("read",), ("write",), ("gate",), ("admin",), ("read", "write"), ("read", "gate"),
          ("read", "write", "gate", "admin")]
AUDIT_TABLE = "audit_events"  # the refusals' trail: another test's (tests/service/api)


@dataclass(frozen=True)
class Objects:
    """What a probe names: project A's objects, or the same slots filled with names and ids
    that exist in no project (NOWHERE)."""

    line: str
    version: str  # of the line `fraud` (A's has one B's lacks)
    evalset: str
    traffic: str
    trainset: str
    decision: int
    job: int
    token: str
    group: str  # granted a role in the project
    project: str
    policy: int  # a policy version of `fraud` (A's has one B's lacks)


NOWHERE = Objects(line="zz-line", version="99", evalset="zz-set", traffic="zz-traffic",
                  trainset="zz-train", decision=999_999, job=999_998, token="zz-token",
                  group="zz-group", project="zz-project", policy=99)


@dataclass(frozen=True)
class Seeded:
    a: Objects
    b_tokens: dict[tuple[str, ...], str]  # B's token of each scope set in SCOPES
    b_secret: str  # the webhook secret of B's `fraud`
    b_own: Objects  # B's own objects in each slot (its decision, job, token ...)


def evalset_without_labels(folder: Path, name: str) -> Path:
    """A traffic set: inputs, no `y`."""
    path = folder / f"{name}.npz"
    np.savez(path, x=np.random.default_rng(3).normal(size=(N, FEATURES)).astype(np.float32))
    return path


def seed_project(client: TestClient, folder: Path) -> tuple[int, int, str]:
    """The objects both projects hold, through `client` (a token of the project): the
    blocked decision's id, its repair job's id and the line's webhook secret."""
    for name, path in (("holdout", write_npz(folder, n=N, num_classes=CLASSES)),
                       ("cal", write_npz(folder, n=60, num_classes=CLASSES, seed=7)),
                       ("traffic", evalset_without_labels(folder, "traffic"))):
        assert post_evalset(client, name, path).status_code == 201
    post_trainset(client, folder, "train")
    add_versions(client, folder, "fraud", "holdout", "1", "2")
    assert gate(client, "fraud", "1").json()["verdict"] == "approve"
    assert client.post("/models/fraud/aliases/production", json={"version": "1"}).is_success
    assert client.put("/models/fraud/policy", json={"max_nfr": 0.05, "evalsets": ["holdout"]}
                      ).status_code == 200
    secret = client.post("/models/fraud/webhook-secret").json()["secret"]
    measure(client, "fraud:1", "fraud:2", "holdout")
    blocked = gate(client, "fraud", "2").json()
    assert blocked["verdict"] == "block", blocked
    repair = client.post(f"/gate/decisions/{blocked['decision_id']}/repair",
                         json={"method": "interpolate", "calibration": "cal"})
    assert repair.status_code == 202, repair.text
    return blocked["decision_id"], repair.json()["job"]["id"], secret


def post_trainset(client: TestClient, folder: Path, name: str) -> None:
    assert client.post("/trainsets", data={"name": name}, files={
        "data": ("t.npz", write_npz(folder, n=40, num_classes=CLASSES).read_bytes())}
    ).status_code == 201


def add_versions(client: TestClient, folder: Path, line: str, evalset: str,
                 *versions: str) -> None:
    """Linear ONNX versions of `line`, each with logits on `evalset`."""
    for version in versions:
        content = write_onnx(folder, CLASSES, seed=int(version)).read_bytes()
        assert post_model(client, line, version, content).status_code == 201
        wrong = range(0, 10) if version == "1" else range(5, 20)
        assert post_logits(client, f"{line}:{version}", evalset,
                           logits_wrong_on(wrong)).status_code == 201


def gate(client: TestClient, line: str, candidate: str) -> Response:
    return client.post("/gate", json={"model": line, "candidate": candidate})


def seed_only_a(client: TestClient, folder: Path) -> None:
    """What project A holds and B does not."""
    for name, path in (("only-a-set", write_npz(folder, n=N, num_classes=CLASSES, seed=5)),
                       ("only-a-traffic", evalset_without_labels(folder, "only-a-traffic"))):
        assert post_evalset(client, name, path).status_code == 201
    post_trainset(client, folder, "only-a-train")
    add_versions(client, folder, "only-a", "only-a-set", "1", "2")
    add_versions(client, folder, "fraud", "holdout", "3")
    assert gate(client, "only-a", "1").json()["verdict"] == "approve"
    assert client.put("/models/fraud/policy", json={"max_nfr": 0.1}).json()["version"] == 2


def seed_projects(client: TestClient, folder: Path) -> Seeded:
    """Projects A (`default`, through the server admin) and B (`beta`, through its admin
    token), and B's tokens of every scope set."""
    with session_scope(client.app.state.sessions) as session:
        beta = create_project(session=session, name=B)
        for project, group in ((get_project(session=session, name=A), "a-ops"),
                               (beta, "b-ops")):
            grant(session=session, project=project, kind="group", principal=group,
                  role="viewer")
        tokens = {scopes: create_token(session=session, name="b-" + "-".join(scopes),
                                       scopes=list(scopes), project=B)[1]
                  for scopes in SCOPES}
        create_token(session=session, name="ci-a", scopes=["read"], project=A)
        session.add(MlflowEvent(delivery_id="only-a-delivery", model="only-a",
                                alias="challenger", version="1", action="received",
                                message=""))
    a_decision, a_job, _ = seed_project(client, folder)
    seed_only_a(client, folder)
    as_b = TestClient(client.app, headers=bearer(tokens[SCOPES[-1]]))
    b_decision, b_job, b_secret = seed_project(as_b, folder)
    assert post_model(as_b, "spare", "1", write_onnx(folder).read_bytes()).status_code == 201
    a = Objects(line="only-a", version="3", evalset="only-a-set", traffic="only-a-traffic",
                trainset="only-a-train", decision=a_decision, job=a_job, token="ci-a",
                group="a-ops", project=A, policy=2)
    b_own = Objects(line="fraud", version="2", evalset="holdout", traffic="traffic",
                    trainset="train", decision=b_decision, job=b_job, token="b-read",
                    group="b-ops", project=B, policy=1)
    return Seeded(a=a, b_tokens=tokens, b_secret=b_secret, b_own=b_own)


client, settings = shared_store(projects=seed_projects)


@pytest.fixture
def projects(client, module_store) -> Seeded:
    """The seeded projects (the client is on their store)."""
    return module_store.seeded


# a probe: from the objects it names (A's or NOWHERE's) and B's own (`b`), the arguments of
# client.request but the method
Probe = Callable[[Objects, Objects], dict[str, Any]]


def raw(content_of: str) -> dict[str, Any]:
    """A raw body (filled in by `with_files`) and its content type."""
    return {"content": content_of, "headers": {"Content-Type": "application/octet-stream"}}


def model_form(name: str, version: str) -> dict[str, Any]:
    return {"data": {"name": name, "version": version}, "files": {"artifact": "onnx"}}


def compare_probes(suffix: str = "") -> list[Probe]:
    """A pair of A's line, a pair of B's line with A's version, and on A's eval set."""
    return [lambda o, b: {"url": f"/compare/{o.line}:1/{o.line}:2{suffix}",
                          "params": {"evalset": "holdout"}},
            lambda o, b: {"url": f"/compare/fraud:1/fraud:{o.version}{suffix}",
                          "params": {"evalset": "holdout"}},
            lambda o, b: {"url": f"/compare/fraud:1/fraud:2{suffix}",
                          "params": {"evalset": o.evalset}}]


def prediction_probes(body: Callable[[str], dict[str, Any]]) -> list[Probe]:
    """Logits of A's line, of A's version of `fraud`, and on A's eval set."""
    return [lambda o, b: {"url": f"/models/{o.line}/versions/1/predictions", **body("holdout")},
            lambda o, b: {"url": f"/models/fraud/versions/{o.version}/predictions",
                          **body("holdout")},
            lambda o, b: {"url": "/models/fraud/versions/1/predictions", **body(o.evalset)}]


def line_and_set(url: str, **extra: Any) -> list[Probe]:
    """`url` (with {line}) on A's line and B's eval set, and on B's `fraud` and A's set."""
    return [lambda o, b: {"url": url.format(line=o.line), "params": {"evalset": "holdout"},
                          **extra},
            lambda o, b: {"url": url.format(line="fraud"), "params": {"evalset": o.evalset},
                          **extra}]


def named_line(url: str, **extra: Any) -> list[Probe]:
    return [lambda o, b: {"url": url.format(line=o.line), **extra}]


PROBES: dict[tuple[str, str], list[Probe]] = {
    ("POST", "/models"): [lambda o, b: model_form(o.line, "1"),
                          lambda o, b: model_form("fraud", o.version)],
    ("PUT", "/models/{name}/versions/{version}"): [
        lambda o, b: {"url": f"/models/{o.line}/versions/1", **raw("onnx")},
        lambda o, b: {"url": f"/models/fraud/versions/{o.version}", **raw("onnx")}],
    ("GET", "/models"): [],
    ("GET", "/models/{name}"): named_line("/models/{line}"),
    ("GET", "/models/{name}/versions/{version}"): [
        lambda o, b: {"url": f"/models/{o.line}/versions/1"},
        lambda o, b: {"url": f"/models/fraud/versions/{o.version}"}],
    ("GET", "/models/{name}/versions/{version}/artifact"): [
        lambda o, b: {"url": f"/models/{o.line}/versions/1/artifact"},
        lambda o, b: {"url": f"/models/fraud/versions/{o.version}/artifact"}],
    ("PUT", "/models/{name}/training-dataset"): [
        lambda o, b: {"url": f"/models/{o.line}/training-dataset", "json": {"dataset": "train"}},
        lambda o, b: {"url": "/models/fraud/training-dataset", "json": {"dataset": o.trainset}}],
    ("PUT", "/models/{name}/classes"): named_line(
        "/models/{line}/classes", json={"class_names": ["a", "b", "c"]}),
    ("POST", "/evalsets"): [lambda o, b: {"data": {"name": o.evalset}, "files": {"data": "npz"}}],
    ("POST", "/trainsets"): [lambda o, b: {"data": {"name": o.trainset},
                                           "files": {"data": "npz"}}],
    ("PUT", "/evalsets/{name}"): [lambda o, b: {"url": f"/evalsets/{o.evalset}", **raw("npz")}],
    ("GET", "/evalsets"): [],
    ("GET", "/trainsets"): [],
    ("POST", "/evalsets/{name}/labels"): [
        lambda o, b: {"url": f"/evalsets/{o.traffic}/labels", "files": {"labels": "labels"}},
        lambda o, b: {"url": f"/evalsets/{o.evalset}/labels", "files": {"labels": "labels"}}],
    ("POST", "/models/{name}/versions/{version}/predictions"): prediction_probes(
        lambda evalset: {"data": {"evalset": evalset}, "files": {"logits": "logits"}}),
    ("PUT", "/models/{name}/versions/{version}/predictions"): prediction_probes(
        lambda evalset: {"params": {"evalset": evalset}, **raw("logits")}),
    ("GET", "/compare/{old}/{new}"): compare_probes(),
    ("GET", "/compare/{old}/{new}/disagreements"): compare_probes("/disagreements"),
    ("POST", "/compare/{old}/{new}"): compare_probes(),
    ("GET", "/models/{name}/matrix"): line_and_set("/models/{line}/matrix"),
    ("POST", "/models/{name}/matrix"): line_and_set("/models/{line}/matrix"),
    ("PUT", "/models/{name}/policy"): [
        lambda o, b: {"url": f"/models/{o.line}/policy", "json": {"max_nfr": 0.2}},
        lambda o, b: {"url": "/models/fraud/policy", "json": {"evalsets": [o.evalset]}}],
    ("GET", "/models/{name}/policy"): [
        lambda o, b: {"url": f"/models/{o.line}/policy"},
        lambda o, b: {"url": "/models/fraud/policy", "params": {"version": o.policy}}],
    ("POST", "/models/{name}/policy/dry-run"): named_line("/models/{line}/policy/dry-run",
                                                          json={"max_nfr": 0.0}),
    ("GET", "/models/{name}/unstable-samples"): line_and_set("/models/{line}/unstable-samples"),
    ("POST", "/models/{name}/webhook-secret"): named_line("/models/{line}/webhook-secret"),
    ("POST", "/gate"): [
        lambda o, b: {"json": {"model": o.line, "candidate": "1"}},
        lambda o, b: {"json": {"model": "fraud", "candidate": o.version}},
        lambda o, b: {"json": {"model": "fraud", "candidate": "2", "evalsets": [o.evalset]}},
        lambda o, b: {"json": {"project": o.project, "model": "fraud", "candidate": "2"}}],
    ("GET", "/gate/decisions/{decision_id}"): [
        lambda o, b: {"url": f"/gate/decisions/{o.decision}"}],
    ("GET", "/models/{name}/decisions"): named_line("/models/{line}/decisions"),
    ("POST", "/gate/decisions/{decision_id}/repair"): [
        lambda o, b: {"url": f"/gate/decisions/{o.decision}/repair",
                      "json": {"method": "interpolate", "calibration": "cal"}},
        lambda o, b: {"url": f"/gate/decisions/{b.decision}/repair",
                      "json": {"method": "interpolate", "calibration": o.evalset}}],
    ("POST", "/models/{name}/aliases/{alias}"): [
        lambda o, b: {"url": f"/models/{o.line}/aliases/production", "json": {"version": "1"}},
        lambda o, b: {"url": "/models/fraud/aliases/production",
                      "json": {"version": o.version, "force": True}}],
    ("GET", "/models/{name}/promotions"): named_line("/models/{line}/promotions"),
    ("GET", "/jobs/{job_id}"): [lambda o, b: {"url": f"/jobs/{o.job}"}],
    ("POST", "/jobs/{job_id}/cancel"): [lambda o, b: {"url": f"/jobs/{o.job}/cancel"}],
    ("GET", "/models/{name}/mlflow-events"): named_line("/models/{line}/mlflow-events"),
    ("POST", "/projects"): [lambda o, b: {"json": {"name": o.project}}],
    ("GET", "/projects"): [],
    ("GET", "/projects/{project}/members"): [
        lambda o, b: {"url": f"/projects/{o.project}/members"}],
    ("PUT", "/projects/{project}/members"): [
        lambda o, b: {"url": f"/projects/{o.project}/members",
                      "json": {"group": b.group, "role": "admin"}},
        lambda o, b: {"url": f"/projects/{b.project}/members",
                      "json": {"group": o.group, "role": "admin"}}],
    ("DELETE", "/projects/{project}/members"): [
        lambda o, b: {"url": f"/projects/{o.project}/members", "json": {"group": b.group}},
        lambda o, b: {"url": f"/projects/{b.project}/members", "json": {"group": o.group}}],
    ("POST", "/tokens"): [
        lambda o, b: {"json": {"name": "minted", "scopes": ["read"], "project": o.project}},
        lambda o, b: {"json": {"name": "minted", "scopes": ["read"]},
                      "params": {"project": o.project}},
        lambda o, b: {"json": {"name": o.token, "scopes": ["read"]}}],
    ("GET", "/tokens"): [],
    ("DELETE", "/tokens/{name}"): [lambda o, b: {"url": f"/tokens/{o.token}"}],
    ("GET", "/audit-events"): [lambda o, b: {"params": {"project": o.project}},
                               lambda o, b: {"params": {"actor": o.token}}],
}
EXEMPT = {
    ("GET", "/openapi.json"): "the API's description names no project's objects",
    ("GET", "/docs"): "the API's documentation page",
    ("GET", "/redoc"): "the API's documentation page",
    ("GET", "/"): "a redirect to the dashboard",
    ("MOUNT", "/ui/static/{path}"): "the dashboard's static files",
    ("MOUNT", "/ui/docs-assets/{path}"): "the documentation pages' static files",
    ("GET", "/healthz"): "a liveness probe: no caller, no project",
    ("GET", "/readyz"): "a readiness probe: no caller, no project",
    ("GET", "/metrics"): "server-level (the metrics scope): counts, no project's names",
    ("POST", "/ui/tokens/{token_id}/revoke"): "a person's own tokens, in any project, by "
    "their mint_personal_token events (a token's signed-in viewer is refused: no person); "
    "another person's token answers as a missing one: tests/ui/test_people_audit.py",
    ("POST", "/integrations/mlflow/webhook"): "signed by MLflow, no token: it serves one "
    "project (FLIPGATE_MLFLOW_PROJECT), test_the_mlflow_connector_serves_its_project",
    ("GET", "/ui/signin"): "the sign-in page, before any project",
    ("POST", "/ui/signin"): "signing in names a token, no project's objects",
    ("POST", "/ui/signout"): "signing out names no project's objects",
    ("GET", "/ui/oidc/start"): "single sign-on's start, before any project (its `next`, a "
    "page of ours, is checked as that page is): tests/ui/test_oidc.py",
    ("GET", "/ui/oidc/callback"): "single sign-on's end, before any project: "
    "tests/ui/test_oidc.py",
}
UI_PROBES: dict[tuple[str, str], list[Probe]] = {
    ("GET", "/ui"): [],
    ("GET", "/ui/lines/{name}"): named_line("/ui/lines/{line}"),
    ("GET", "/ui/lines/{name}/pairs/{old}/{new}"): [
        lambda o, b: {"url": f"/ui/lines/{o.line}/pairs/1/2", "params": {"evalset": "holdout"}},
        lambda o, b: {"url": "/ui/lines/fraud/pairs/1/2", "params": {"evalset": o.evalset}}],
    ("GET", "/ui/lines/{name}/pairs/{old}/{new}/disagreements"): [
        lambda o, b: {"url": f"/ui/lines/{o.line}/pairs/1/2/disagreements",
                      "params": {"evalset": "holdout"}}],
    ("GET", "/ui/decisions/{decision_id}"): [lambda o, b: {"url": f"/ui/decisions/{o.decision}"}],
    ("GET", "/ui/jobs"): [],
    ("GET", "/ui/tokens"): [],
    ("POST", "/ui/tokens"): [lambda o, b: {"data": {"read": "true", "expires_in_days": "1"}}],
    ("GET", "/ui/audit"): [lambda o, b: {"params": {"actor": o.token}}],
}
LIST_PAGES = ["/ui", "/ui/jobs", "/ui/audit"]


def app_routes(app) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves (a mount: ("MOUNT", path))."""
    found = set()
    for route in iter_route_contexts(app.routes):
        methods = (route.methods or {"MOUNT"}) - {"HEAD"}
        found |= {(method, route.path_format) for method in methods}
    return found


def test_every_route_is_in_the_table(client):
    """A new route fails here until PROBES, UI_PROBES or EXEMPT says how it is tested."""
    served = app_routes(client.app)
    listed = set(PROBES) | set(UI_PROBES) | set(EXEMPT)
    assert served - listed == set(), "add these routes to the isolation table"
    assert listed - served == set(), "these routes are gone: remove them from the table"


class Attacker:
    """Sends a probe for A's objects and for NOWHERE's as one of B's callers (a client with
    B's token in `headers`, or a browser signed in with it), each in a savepoint rolled back
    afterwards, and records how the answers, the database's changes or the audit events
    they wrote differ."""

    def __init__(self, client: TestClient, seeded: Seeded, folder: Path) -> None:
        self.seeded = seeded
        self.connection = client.app.state.connection
        self.files = upload_files(folder)
        self.baseline = dump(self.connection)
        # A's names and NOWHERE's are `<named>` in either answer (A's policy version 2 is
        # also the version 2 of a pair that both probes name)
        self.names = slot_values(seeded.a, NOWHERE)
        self.last_event = self.connection.scalar(select(func.max(AuditEvent.id))) or 0
        self.mismatches: list[str] = []

    def probe(self, caller: TestClient, method: str, path: str, probe: Probe, label: str,
              headers: dict[str, str] | None = None) -> None:
        """Record a mismatch between the answers to A's and NOWHERE's objects."""
        answers = [self.answer(caller, method, path, probe, objects, headers or {})
                   for objects in (self.seeded.a, NOWHERE)]
        if answers[0] != answers[1]:
            self.mismatches.append(f"{method} {path} [{label}]: A {answers[0]} != "
                                   f"nowhere {answers[1]}")

    def answer(self, caller: TestClient, method: str, path: str, probe: Probe,
               objects: Objects, headers: dict[str, str]) -> tuple[Any, ...]:
        """The normalized answer, the database's changes and the audit events written (all
        rolled back)."""
        arguments = self.with_files(probe(objects, self.seeded.b_own))
        headers = {**arguments.pop("headers", {}), **headers}
        savepoint = self.connection.begin_nested()
        try:
            written = writes(self.connection)
            response = caller.request(method, arguments.pop("url", path), headers=headers,
                                      **arguments)
            wrote = written is None or writes(self.connection) != written
            changes = changed(self.baseline, dump(self.connection)) if wrote else {}
            events = self.events_written()
        finally:
            savepoint.rollback()
        return response.status_code, normalized(response, self.names), changes, events

    def events_written(self) -> list[tuple[str, str, str | None]]:
        """(action, outcome, reason) of each audit event written since the baseline."""
        return sorted(tuple(row) for row in self.connection.execute(
            select(AuditEvent.action, AuditEvent.outcome, AuditEvent.reason)
            .where(AuditEvent.id > self.last_event)))

    def with_files(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The probe's arguments with the named upload contents filled in."""
        if "files" in arguments:
            arguments["files"] = {field: (f"{kind}.bin", self.files[kind])
                                  for field, kind in arguments["files"].items()}
        if "content" in arguments:
            arguments["content"] = self.files[arguments["content"]]
        return arguments


def upload_files(folder: Path) -> dict[str, bytes]:
    """The contents that probes upload, by kind."""
    buffer_labels = folder / "labels.npz"
    np.savez(buffer_labels, index=np.arange(5), y=np.arange(5) % CLASSES)
    return {"onnx": write_onnx(folder, CLASSES, seed=9).read_bytes(),
            "npz": write_npz(folder, n=N, num_classes=CLASSES, seed=11).read_bytes(),
            "logits": npy_bytes(logits_wrong_on(range(3))),
            "labels": buffer_labels.read_bytes()}


def dump(connection) -> dict[str, frozenset]:
    """Every row of every table but the audit trail."""
    return {table.name: frozenset(repr(tuple(row)) for row in connection.execute(select(table)))
            for table in Base.metadata.sorted_tables if table.name != AUDIT_TABLE}


def writes(connection) -> int | None:
    """How many rows were inserted, updated and deleted so far in this transaction in the
    tables but the audit trail (PostgreSQL's per-transaction counts; None on SQLite, which
    keeps none): a request that leaves the count as it was changed no row, so the dump of
    every table is needed only after one that did not."""
    if connection.dialect.name != "postgresql":
        return None
    return connection.scalar(text(
        "SELECT sum(pg_stat_get_xact_tuples_inserted(c.oid) + "
        "pg_stat_get_xact_tuples_updated(c.oid) + pg_stat_get_xact_tuples_deleted(c.oid)) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname <> :audit"),
        {"audit": AUDIT_TABLE})


def changed(before: dict[str, frozenset], after: dict[str, frozenset]) -> dict[str, Any]:
    """Per table: the rows changed or removed (as they were), and how many rows were added."""
    return {name: (sorted(rows - after[name]), len(after[name] - rows))
            for name, rows in before.items() if rows != after[name]}


VOLATILE_KEY = re.compile(r"(^|_)(id|ids|at)$|^(sha256|digest|etag|token)$")


def slot_values(*objects: Objects) -> tuple[str, ...]:
    """The names and ids of `objects`, the longest first (`only-a-set` before `only-a`)."""
    values = {str(getattr(each, slot.name)) for each in objects for slot in fields(each)}
    return tuple(sorted(values, key=lambda value: (-len(value), value)))




def normalized(response: Response, names: tuple[str, ...]) -> str:
    """The body with `names`, where text names them, as `<named>`, and (in JSON) the values
    of ids and times, which differ between two requests that add rows, left out."""
    try:
        body = response.json()
    except ValueError:
        text = named_slots(response.text, names)
    else:
        text = json.dumps(scrubbed(body, names), sort_keys=True)
    return f"{response.headers.get('content-type')} {text}"


def named_slots(text: str, names: tuple[str, ...]) -> str:
    """`text` with each of `names` (a word of its own) as `<named>`."""
    for name in names:
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", "<named>", text)
    return text


def scrubbed(body: Any, names: tuple[str, ...]) -> Any:
    """A JSON body with `names` in its texts as `<named>` (named_slots) and volatile values
    left out."""
    if isinstance(body, dict):
        return {key: "<volatile>" if VOLATILE_KEY.search(key) else scrubbed(value, names)
                for key, value in body.items()}
    if isinstance(body, list):
        return [scrubbed(item, names) for item in body]
    return named_slots(body, names) if isinstance(body, str) else body


def project_probe(path: str, probes: list[Probe]) -> Probe | None:
    """The route's first probe on B's own objects, naming project A in `?project=` (none
    for POST /gate, whose body names the project: its probes do)."""
    if path == "/gate":
        return None
    first = probes[0] if probes else (lambda o, b: {})

    def naming(o: Objects, b: Objects) -> dict[str, Any]:
        arguments = first(b, b)
        arguments["params"] = {**arguments.get("params", {}), "project": o.project}
        return arguments

    return naming


def labelled_probes(path: str, probes: list[Probe]) -> list[tuple[int | str, Probe]]:
    """The route's probes by index, and its probe naming project A (project_probe)."""
    extra = project_probe(path, probes)
    return [*enumerate(probes), *([("project", extra)] if extra else [])]


def test_project_b_gets_for_project_a_what_a_missing_name_gets(client, projects, tmp_path):
    """Every route × every scope set of B's tokens: A's objects answer as missing ones."""
    attacker = Attacker(client, projects, tmp_path)
    for (method, path), probes in PROBES.items():
        for scopes in SCOPES:
            token = projects.b_tokens[scopes]
            for index, probe in labelled_probes(path, probes):
                attacker.probe(client, method, path, probe, f"{','.join(scopes)} #{index}",
                               bearer(token))
    assert not attacker.mismatches, "\n".join(attacker.mismatches)


def names(client: TestClient, path: str, token: str) -> list[str]:
    response = client.get(path, headers=bearer(token))
    assert response.status_code == 200, response.text
    return sorted(item["name"] for item in response.json())


def test_lists_from_b_show_only_bs_objects(client, projects):
    b_decisions = {row["decision_id"] for row in client.get(
        "/models/fraud/decisions", params={"project": B}).json()}
    for scopes, token in projects.b_tokens.items():
        if not {"read", "admin"} & set(scopes):
            continue
        assert names(client, "/models", token) == ["fraud", "spare"]
        assert names(client, "/evalsets", token) == ["cal", "holdout", "traffic"]
        assert names(client, "/trainsets", token) == ["train"]
        decisions = client.get("/models/fraud/decisions", headers=bearer(token)).json()
        assert {row["decision_id"] for row in decisions} == b_decisions
        promotions = client.get("/models/fraud/promotions", headers=bearer(token)).json()
        assert [row["decision_id"] in b_decisions for row in promotions] == [True]
    assert projects.a.decision not in b_decisions


def signed_gate(client: TestClient, secret: str, **body: str) -> Response:
    """POST /gate signed with `secret`, no bearer token."""
    content = json.dumps({"candidate": "2", **body}).encode()
    return client.post("/gate", content=content, headers={
        "Authorization": "", "Content-Type": "application/json",
        HEADER: signature(secret, content)})


def test_a_signed_webhook_gates_only_its_own_line(client, projects):
    """B's secret of `fraud`, on A's `fraud`, on A's project by name, or on B's other line,
    is refused exactly as on a line or project of none."""
    secret = projects.b_secret
    assert signed_gate(client, secret, project=B, model="fraud").status_code in (200, 202)
    for named, nowhere in (({"project": A, "model": "fraud"},
                            {"project": A, "model": NOWHERE.line}),
                           ({"project": A, "model": "fraud"},
                            {"project": NOWHERE.project, "model": "fraud"}),
                           ({"model": "fraud"}, {"model": NOWHERE.line}),
                           ({"project": B, "model": "spare"},
                            {"project": B, "model": NOWHERE.line})):
        answers = [signed_gate(client, secret, **body) for body in (named, nowhere)]
        assert [answer.status_code for answer in answers] == [401, 401]
        assert [answer.text.replace(body["model"], "<line>")
                for answer, body in zip(answers, (named, nowhere), strict=True)] == [
            answers[1].text.replace(nowhere["model"], "<line>")] * 2


def test_the_mlflow_connector_serves_its_project(client, projects):
    """With FLIPGATE_MLFLOW_PROJECT=beta, MLflow's alias move queues a job of B's, and only
    B's callers read the connector's log."""
    settings = client.app.state.settings
    settings.mlflow_webhook_secret, settings.mlflow_project = SecretStr("mlflow-secret"), B
    body = alias_event("fraud", "challenger", "2")
    queued = client.post("/integrations/mlflow/webhook", content=body,
                         headers=signed(body, secret="mlflow-secret"))
    assert queued.status_code == 202, queued.text
    with session_scope(client.app.state.sessions) as session:  # of every project
        job = session.get_one(Job, queued.json()["job_id"])
        assert job.project_id == get_project(session=session, name=B).id
    reader = projects.b_tokens[("read",)]
    logged = client.get("/models/fraud/mlflow-events", headers=bearer(reader)).json()
    assert [event["action"] for event in logged] == ["received"]
    assert client.get("/models/fraud/mlflow-events").json() == []
    assert client.get("/models/only-a/mlflow-events").json() == []


def signed_in(client: TestClient, token: str) -> TestClient:
    """A client of the dashboard signed in with `token`."""
    browser = TestClient(client.app, raise_server_exceptions=False)
    assert browser.post("/ui/signin", data={"token": token}).status_code == 200
    return browser


def test_dashboard_pages_answer_b_as_for_a_missing_name(client, projects, tmp_path):
    """The dashboard's pages, for people signed in with B's read token and B's token of
    every scope: A's objects and project answer as missing ones, and the lists show none of
    A's."""
    browsers = {scopes: signed_in(client, projects.b_tokens[scopes])
                for scopes in (("read",), SCOPES[-1])}
    attacker = Attacker(client, projects, tmp_path)
    for (method, path), probes in UI_PROBES.items():
        for scopes, browser in browsers.items():
            for index, probe in labelled_probes(path, probes):
                attacker.probe(browser, method, path, probe, f"{','.join(scopes)} #{index}")
    assert not attacker.mismatches, "\n".join(attacker.mismatches)
    for browser, path in itertools.product(browsers.values(), LIST_PAGES):
        page = browser.get(path)
        assert page.status_code in (200, 403), page.text
        assert "only-a" not in page.text
        assert f"/ui/decisions/{projects.a.decision}" not in page.text


def test_the_sweepers_reconcile_job_is_in_the_connectors_project(client, projects):
    state = client.app.state
    state.settings.mlflow_project = B
    reconcile_mlflow(state.sessions, state.celery, state.settings)
    with session_scope(state.sessions) as session:  # of every project
        job = session.scalars(select(Job).where(Job.kind == "mlflow")).one()
        assert (job.params, job.project_id) == ({"reconcile": True},
                                                get_project(session=session, name=B).id)


OWNED = {mapper.local_table.name: mapper.class_ for mapper in Base.registry.mappers
         if issubclass(mapper.class_, ProjectOwned)}  # tables a bound session filters


@contextmanager
def route_loading_by_raw_id(client: TestClient) -> Iterator[str]:
    """A route added to the app as a future one might be written, with no check of its own:
    GET /raw/{table}/{row_id} loads the row of a project-owned table by its id through the
    request's session (`session.get`), 404 `row_not_found` when there is none; removed
    afterwards. Yields its path's prefix."""
    router = APIRouter(prefix="/raw", route_class=CommittingRoute)

    @router.get("/{table}/{row_id}", dependencies=[require("read")])
    def load(table: str, row_id: int, session: SessionDep) -> dict[str, int]:
        row = session.get(OWNED[table], row_id)
        if row is None:
            raise NotFound("row_not_found", f"no {table} row {row_id}")
        return {"id": row.id}

    routes = client.app.router.routes
    added = len(routes)
    client.app.include_router(router)
    try:
        yield "/raw"
    finally:
        del routes[added:]


def ids_by_table(client: TestClient, project: str) -> dict[str, list[int]]:
    """The ids of `project`'s rows in each project-owned table (read unbound: every row)."""
    with session_scope(client.app.state.sessions) as session:
        project_id = get_project(session=session, name=project).id
        return {table: list(session.scalars(select(model.id)
                                            .where(model.project_id == project_id)))
                for table, model in OWNED.items()}


def answer_to(client: TestClient, url: str, row_id: int, token: str) -> tuple[int, str]:
    """The status and body of GET `url` with `token`, the row's id in the body as <id>."""
    response = client.get(url, headers=bearer(token))
    return response.status_code, response.text.replace(str(row_id), "<id>")


def test_a_row_loaded_by_a_raw_id_is_filtered_by_its_project(client, projects):
    """Versions, lines, data sets, jobs and decisions are scoped by their own project_id, not
    by the routes that reach them: a new route that loads A's row by its raw id, asked by
    B's read token, answers exactly as for an id of none; A's caller and B's own rows get
    the row."""
    assert {"model_versions", "model_lines", "datasets", "jobs", "gate_decisions"} <= set(OWNED)
    reader, missing = projects.b_tokens[("read",)], NOWHERE.decision
    a_rows, b_rows = ids_by_table(client, A), ids_by_table(client, B)
    assert all(a_rows.values()) and all(b_rows.values())
    with route_loading_by_raw_id(client) as prefix:
        for table in OWNED:
            none = answer_to(client, f"{prefix}/{table}/{missing}", missing, reader)
            assert none[0] == 404 and "row_not_found" in none[1]
            for row_id in a_rows[table]:
                url = f"{prefix}/{table}/{row_id}"
                assert answer_to(client, url, row_id, reader) == none, url
                assert client.get(url).json() == {"id": row_id}  # the server admin, in A
            for row_id in b_rows[table]:
                assert answer_to(client, f"{prefix}/{table}/{row_id}", row_id, reader) == (
                    200, '{"id":<id>}')
