"""The audit trail over HTTP: a scripted session leaves exactly its events, newest first;
a failed change leaves none; refusals of known callers are written, a flood of unknown
tokens is not; admins of a project see only its events; nothing can change an event."""

import json
from datetime import timedelta

import numpy as np
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import func, select, update

from flipgate.signing import signature
from service.auth.models import ApiToken
from service.auth.service import create_token, revoke_token
from service.db import utcnow
from service.projects.models import AuditEvent
from service.projects.service import create_project
from tests.service.api.conftest import (
    ADMIN_TOKEN,
    bearer,
    error_code,
    post_evalset,
    post_logits,
    post_model,
)
from tests.service.conftest import write_npz, write_onnx

N, CLASSES = 30, 3
FIELDS = ("actor", "auth", "project", "action", "outcome", "reason", "request_id")


@pytest.fixture
def other(db) -> str:
    """A read,write,gate token of a second project `beta`."""
    with db() as session:
        create_project(session=session, name="beta")
        return create_token(session=session, name="beta-ci", scopes=["read", "write", "gate"],
                            project="beta")[1]


def events(client, token: str = ADMIN_TOKEN, **filters) -> list[dict]:
    response = client.get("/audit-events", params=filters, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()["events"]


def summary(found: list[dict]) -> list[tuple]:
    return [tuple(event[field] for field in FIELDS) for event in found]


def tagged(client, method: str, url: str, request_id: str, **kwargs):
    """A request with its own X-Request-ID."""
    headers = {"X-Request-ID": request_id, **kwargs.pop("headers", {})}
    return client.request(method, url, headers=headers, **kwargs)


def logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(N, CLASSES))


def test_a_scripted_session_leaves_exactly_its_events_in_order(client, tmp_path, other):
    npz = write_npz(tmp_path, n=N, num_classes=CLASSES).read_bytes()
    model = write_onnx(tmp_path).read_bytes()
    steps = [
        ("POST", "/evalsets", dict(data={"name": "ev"}, files={"data": ("d.npz", npz)})),
        ("POST", "/models", dict(data={"name": "fraud", "version": "1"},
                                 files={"artifact": ("m.onnx", model)})),
        ("POST", "/models/fraud/versions/1/predictions",
         dict(data={"evalset": "ev"}, files={"logits": ("l.npy", _npy(logits(0)))})),
        ("POST", "/gate", dict(json={"model": "fraud", "candidate": "1"})),
        ("POST", "/models/fraud/aliases/production", dict(json={"version": "1"})),
        ("PUT", "/models/fraud/policy", dict(json={"max_nfr": 0.05})),
    ]
    for number, (method, url, kwargs) in enumerate(steps):
        answer = tagged(client, method, url, f"step-{number}", **kwargs)
        assert answer.is_success, answer.text
    refused = tagged(client, "GET", "/models/fraud", "step-x", headers=bearer(other))
    assert error_code(refused, 404) == "line_not_found"
    assert client.get("/models/fraud").status_code == 200  # a read changes nothing
    admin = [("admin", "admin_token", "default", action, "ok", None, f"step-{number}")
             for number, action in enumerate(["register_evalset", "register_version",
                                              "upload_predictions", "gate", "move_alias",
                                              "put_policy"])]
    denied = ("beta-ci", "token", "beta", "read_line", "denied", "line_not_found", "step-x")
    found = events(client)
    assert summary(found) == [denied, *reversed(admin)]
    assert [event["resource"] for event in found[:2]] == ["/models/fraud", "/models/fraud/policy"]
    assert all(event["client"] == "testclient" for event in found)
    assert [event["id"] for event in found] == sorted((e["id"] for e in found), reverse=True)


def _npy(array: np.ndarray) -> bytes:
    from tests.service.api.conftest import npy_bytes

    return npy_bytes(array)
