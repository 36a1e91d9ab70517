"""Liveness and readiness probes."""

import pytest
from fastapi.testclient import TestClient

from flipgate.upload_client import DIGEST_WANTED_HEADER
from service.main import create_app
from tests.service.api.conftest import error_code

pytestmark = pytest.mark.both_backends  # /readyz names the database's dialect


def test_healthz_and_readyz_need_no_token(client):
    anonymous = TestClient(client.app)
    alive = anonymous.get("/healthz")
    assert alive.json() == {"status": "ok"}
    assert DIGEST_WANTED_HEADER not in alive.headers  # the local folder gains nothing by it
    ready = anonymous.get("/readyz")
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert {name: check["status"] for name, check in checks.items()} == {
        "database": "ok", "broker": "ok", "artifacts": "ok"}
    assert checks["broker"]["detail"] == "embedded"


def test_readyz_is_503_when_the_broker_does_not_answer(settings):
    app = create_app(settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}))
    with TestClient(app) as client:
        response = client.get("/readyz")
    body = response.json()
    assert (response.status_code, body["error"]["code"]) == (503, "not_ready")
    assert body["checks"]["broker"]["status"] == "failed"
    assert body["checks"]["database"]["status"] == "ok"


def test_openapi_is_served_with_a_tag_per_domain(client):
    spec = client.get("/openapi.json").json()
    assert {tag["name"] for tag in spec["tags"]} >= {"models", "evalsets", "predictions",
                                                     "compare", "jobs", "health"}
    assert client.get("/docs").status_code == 200
    assert error_code(client.get("/nowhere"), 404) == "not_found"


def secrets_of(settings, engine, broker_url: str) -> list[str]:
    """What /readyz must never show: URLs, hosts, ports, user names, database names, paths."""
    url = engine.url
    found = [str(settings.data_dir), broker_url, "broker-user", "broker-password", "127.0.0.1",
             str(url.database), url.render_as_string()]
    return found + [str(part) for part in (url.host, url.port) if part]


def test_readyz_names_no_url_host_user_or_path(client, engine):
    body = TestClient(client.app).get("/readyz").json()
    assert body == {"status": "ready", "checks": {
        "database": {"status": "ok", "detail": engine.dialect.name},
        "broker": {"status": "ok", "detail": "embedded"},
        "artifacts": {"status": "ok", "detail": "local"}}}  # its kind, as the others


def test_a_failing_broker_is_named_without_its_address(settings, engine):
    broker_url = "redis://broker-user:broker-password@127.0.0.1:1/0"
    app = create_app(settings.model_copy(update={"redis_url": broker_url}))
    with TestClient(app) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"] == {"status": "failed",
                                                   "detail": "does not answer (ConnectionError)"}
    assert not [secret for secret in secrets_of(settings, engine, broker_url)
                if secret and secret in response.text]
