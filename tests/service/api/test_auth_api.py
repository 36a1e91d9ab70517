"""Bearer tokens: the bootstrap admin token, stored tokens and their scopes."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.auth.models import ApiToken
from service.auth.service import create_token
from service.config import Settings, get_settings
from service.db import utcnow
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


def test_an_admin_revokes_a_token_and_it_stops_authenticating(client, mint, db):
    token = mint("read")
    assert client.get("/models", headers=bearer(token)).status_code == 200
    assert client.delete("/tokens/read").status_code == 204
    assert error_code(client.get("/models", headers=bearer(token)), 401) == "invalid_token"
    assert client.delete("/tokens/read").status_code == 204  # again: still revoked
    with db() as session:
        row = session.scalars(select(ApiToken).where(ApiToken.name == "read")).one()
        assert row.revoked_at is not None  # the row stays for the audit trail


def test_only_an_admin_revokes_and_only_known_tokens(client, mint, db):
    writer = mint("write", "gate")
    refused = client.delete("/tokens/write-gate", headers=bearer(writer))
    assert error_code(refused, 403) == "missing_scope"
    with db() as session:
        assert session.scalars(select(ApiToken.revoked_at)).all() == [None]
    assert error_code(client.delete("/tokens/nobody"), 404) == "token_not_found"


def test_an_expired_token_is_401_token_expired(client, db):
    with db() as session:
        row, token = create_token(session=session, name="ci", scopes=["read"],
                                  expires_in=timedelta(days=1))
    assert client.get("/models", headers=bearer(token)).status_code == 200
    with db() as session:
        session.get(ApiToken, row.id).expires_at = utcnow() - timedelta(minutes=1)
    response = client.get("/models", headers=bearer(token))
    assert error_code(response, 401) == "token_expired"
    assert response.headers["www-authenticate"] == "Bearer"


def test_the_cli_creates_an_expiring_token_and_revokes_it(environment_settings, run_cli):
    created = run_cli("token", "create", "--name", "ci", "--scopes", "read",
                      "--expires-in", "7")
    assert created.code == 0, created.err
    assert "expires" in created.err
    token = created.out.strip()
    with TestClient(create_app(environment_settings), headers=bearer(token)) as client:
        assert client.get("/models").status_code == 200
        revoked = run_cli("token", "revoke", "ci")
        assert (revoked.code, revoked.err.strip()) == (0, "token 'ci' is revoked")
        assert error_code(client.get("/models"), 401) == "invalid_token"
    unknown = run_cli("token", "revoke", "nobody")
    assert unknown.code == 2 and "no token named 'nobody'" in unknown.err
    never = run_cli("token", "create", "--name", "x", "--scopes", "read", "--expires-in", "0")
    assert never.code == 2 and "positive integer" in never.err
