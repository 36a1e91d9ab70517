"""Bearer tokens: the bootstrap admin token, stored tokens and their scopes."""

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.config import Settings, get_settings
from service.main import create_app
from service.migrate import upgrade
from tests.service.api.conftest import bearer, error_code


def test_a_request_without_a_token_is_401(client):
    anonymous = TestClient(client.app)
    response = anonymous.get("/models")
    assert error_code(response, 401) == "missing_token"
    assert response.headers["www-authenticate"] == "Bearer"


def test_an_unknown_token_is_401(client):
    assert error_code(client.get("/models", headers=bearer("fg_wrong")), 401) == "invalid_token"


def test_a_read_token_reads_but_cannot_register(client, mint, upload_model):
    token = mint("read")
    assert client.get("/models", headers=bearer(token)).json() == []
    client.headers.update(bearer(token))
    assert error_code(upload_model("digits", "1.0"), 403) == "missing_scope"
    assert error_code(client.post("/jobs/1/cancel"), 403) == "missing_scope"


def test_the_admin_token_may_do_everything(client, upload_model):
    assert upload_model("digits", "1.0").status_code == 201
    assert client.get("/models").json()[0]["name"] == "digits"


@pytest.fixture
def environment_settings(tmp_path, monkeypatch) -> Iterator[Settings]:
    """Settings from FLIPGATE_DATA_DIR (a fresh, migrated SQLite database), as the CLI reads
    them; the cached settings are forgotten before and after."""
    monkeypatch.setenv("FLIPGATE_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    upgrade(get_settings())
    yield get_settings()
    get_settings.cache_clear()


def test_a_token_minted_by_the_cli_authenticates(environment_settings, run_cli):
    """`flipgate token create`, then the app as it runs in production (no test session)."""
    result = run_cli("token", "create", "--name", "ci", "--scopes", "read,write")
    assert result.code == 0, result.err
    token = result.out.strip()
    assert token.startswith("fg_") and "not shown again" in result.err
    with TestClient(create_app(environment_settings), headers=bearer(token)) as client:
        assert client.get("/models").status_code == 200
        assert error_code(client.get("/models/none"), 404) == "line_not_found"
    duplicate = run_cli("token", "create", "--name", "ci", "--scopes", "read")
    assert duplicate.code == 2 and "exists" in duplicate.err
