"""Hostile requests tried by hand beyond those of issue 12: odd content types, huge headers,
duplicate fields, look-alike unicode names, absurd limits, malformed bodies. Each answers its
4xx with a machine-readable code, and leaves the database and the artifact store as they
were."""

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import func, inspect, select, table

from tests.service.api.conftest import bearer, error_code

POLICY = "/models/digits/policy"
DECISIONS = "/models/digits/decisions"
JSON = {"content-type": "application/json"}
FORM = {"content-type": "application/x-www-form-urlencoded"}
DEEP = 100_000  # nesting past any recursion limit


def stored_files(client: TestClient) -> list[Path]:
    root = client.app.state.settings.artifacts_dir
    return sorted(path for path in root.rglob("*") if path.is_file())


def row_counts(client: TestClient) -> dict[str, int]:
    """The number of rows of every table of the database but the audit trail's (a refusal of
    a known caller is an event of it: docs/access.md)."""
    with client.app.state.sessions() as session:
        names = set(inspect(session.connection()).get_table_names()) - {"audit_events"}
        return {name: session.scalar(select(func.count()).select_from(table(name)))
                for name in names}


@pytest.fixture
def uploads(client, upload_model, upload_evalset, npz_file, onnx_file) -> dict[str, bytes]:
    """A line `digits` with version 1 and an eval set `eval`; the bytes of a valid model and
    eval set for further uploads."""
    assert upload_model("digits", "1").status_code == 201
    assert upload_evalset("eval", npz_file(n=30)).status_code == 201
    return {"onnx": onnx_file(3, seed=5).read_bytes(), "npz": npz_file(n=12, seed=4).read_bytes()}


def new_model(client: TestClient, uploads: dict, name: str, **request) -> Response:
    return client.post("/models", data={"name": name, "version": "1"},
                       files={"artifact": ("m.onnx", uploads["onnx"])}, **request)


def new_evalset(client: TestClient, uploads: dict, name: str) -> Response:
    return client.post("/evalsets", data={"name": name},
                       files={"data": ("d.npz", uploads["npz"])})


Case = Callable[[TestClient, dict], Response]
CASES: list[tuple[str, Case, int, str]] = [
    # content types that do not match the endpoint
    ("text/plain to a form endpoint", lambda c, u: c.post(
        "/models", content=b"name=x", headers={"content-type": "text/plain"}),
     422, "invalid_request"),
    ("JSON to a form endpoint", lambda c, u: c.post(
        "/models", json={"name": "x", "version": "1"}), 422, "invalid_request"),
    ("a form to a JSON endpoint", lambda c, u: c.put(POLICY, data={"max_nfr": "0.1"}),
     422, "invalid_request"),
    ("JSON labelled application/xml", lambda c, u: c.put(
        POLICY, content=b'{"max_nfr": 0.1}', headers={"content-type": "application/xml"}),
     422, "invalid_request"),
    # malformed bodies
    ("truncated JSON", lambda c, u: c.put(POLICY, content=b'{"max_nfr": ', headers=JSON),
     422, "invalid_request"),
    ("JSON nested 100,000 deep", lambda c, u: c.put(
        POLICY, content=b"[" * DEEP + b"]" * DEEP, headers=JSON), 400, "bad_request"),
    ("a NUL byte 100,000 deep", lambda c, u: c.put(
        POLICY, content=b"[" * DEEP + b'"\\u0000"' + b"]" * DEEP, headers=JSON),
     400, "bad_request"),
    ("a JSON array for an object", lambda c, u: c.put(POLICY, json=[0.1]),
     422, "invalid_request"),
    ("invalid UTF-8 in JSON", lambda c, u: c.put(
        POLICY, content=b'{"max_nfr": "\xff\xfe"}', headers=JSON), 400, "bad_request"),
    ("invalid UTF-8 in a form", lambda c, u: c.post(
        "/evalsets", content=b"name=\xff\xfe", headers=FORM), 422, "invalid_request"),
    ("multipart without a boundary", lambda c, u: c.post(
        "/models", content=b"--x\r\n", headers={"content-type": "multipart/form-data"}),
     400, "bad_request"),
    ("truncated multipart", lambda c, u: c.post(
        "/models", content=b'--xx\r\nContent-Disposition: form-data; name="name"\r\n\r\nab',
        headers={"content-type": "multipart/form-data; boundary=xx"}), 422, "invalid_request"),
    ("5,000 form fields", lambda c, u: c.post(
        "/models", content="&".join(f"f{i}=1" for i in range(5000)).encode(), headers=FORM),
     400, "bad_request"),
    ("a file name of 5,000 characters", lambda c, u: c.post(
        "/evalsets", data={"name": "e2"}, files={"data": ("x" * 5000 + ".npz", u["npz"])}),
     400, "bad_request"),
    # numbers that are no finite numbers of the right type
    ("true as a policy limit", lambda c, u: c.put(POLICY, json={"max_nfr": True}),
     422, "invalid_request"),
    ("1e400 as a policy limit", lambda c, u: c.put(
        POLICY, content=b'{"max_nfr": 1e400}', headers=JSON), 422, "invalid_request"),
    ("NaN as a policy limit", lambda c, u: c.put(
        POLICY, content=b'{"max_nfr": NaN}', headers=JSON), 422, "invalid_request"),
    # duplicate fields: the API never guesses which one was meant
    ("a form field given twice", lambda c, u: c.post(
        "/models", data={"name": ["a", "b"], "version": "1"},
        files={"artifact": ("m.onnx", u["onnx"])}), 422, "duplicate_field"),
    ("a file given twice", lambda c, u: c.post(
        "/models", data={"name": "dd", "version": "1"},
        files=[("artifact", ("m.onnx", u["onnx"])), ("artifact", ("n.onnx", u["onnx"]))]),
     422, "duplicate_field"),
    ("a query parameter given twice", lambda c, u: c.get(
        "/compare/digits:1/digits:1", params=[("evalset", "eval"), ("evalset", "other")]),
     422, "duplicate_field"),
    # names: unicode that looks like ASCII, control characters, lengths
    ("a decomposed accent (NFD)", lambda c, u: new_model(c, u, "cafe\u0301"),
     422, "invalid_line_name"),
    ("fullwidth letters", lambda c, u: new_model(c, u, "\uff44igits"),
     422, "invalid_line_name"),
    ("a dotless i is another line", lambda c, u: c.get("/models/d\u0131gits"),
     404, "line_not_found"),
    ("a right-to-left override", lambda c, u: new_evalset(c, u, "eval\u202e"),
     422, "invalid_dataset_name"),
    ("a no-break space in an alias", lambda c, u: c.post(
        "/models/digits/aliases/prod\u00a0", json={"version": "1"}), 422, "invalid_alias"),
    ("an empty name", lambda c, u: new_model(c, u, ""), 422, "invalid_request"),
    ("a name of 5,000 characters", lambda c, u: new_model(c, u, "a" * 5000),
     422, "invalid_line_name"),
    ("'..' as a name", lambda c, u: new_evalset(c, u, ".."), 422, "invalid_dataset_name"),
    # limits and ids
    ("limit 0", lambda c, u: c.get(DECISIONS, params={"limit": 0}), 422, "invalid_request"),
    ("limit -1", lambda c, u: c.get(DECISIONS, params={"limit": -1}), 422, "invalid_request"),
    ("limit 1,000,000", lambda c, u: c.get(DECISIONS, params={"limit": 10**6}),
     422, "invalid_request"),
    ("limit 1.5", lambda c, u: c.get(DECISIONS, params={"limit": "1.5"}),
     422, "invalid_request"),
    ("before 0", lambda c, u: c.get(DECISIONS, params={"before": 0}), 422, "invalid_request"),
    ("a negative job id", lambda c, u: c.get("/jobs/-1"), 404, "job_not_found"),
    # credentials
    ("a 100 kB bearer token", lambda c, u: c.get("/models", headers=bearer("t" * 100_000)),
     401, "invalid_token"),
    ("basic instead of bearer", lambda c, u: c.get(
        "/models", headers={"Authorization": "Basic dXNlcjpwYXNz"}), 401, "missing_token"),
    ("an unsigned gate request", lambda c, u: c.post(
        "/gate", json={"model": "digits", "candidate": "1"}, headers={"Authorization": ""}),
     401, "missing_credentials"),
    ("an unknown method", lambda c, u: c.patch("/models"), 405, "method_not_allowed"),
]


@pytest.mark.parametrize(("send", "status", "code"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_a_hostile_request_is_refused_and_changes_nothing(client, uploads, send, status, code):
    before = (row_counts(client), stored_files(client))
    assert error_code(send(client, uploads), status) == code
    assert (row_counts(client), stored_files(client)) == before
