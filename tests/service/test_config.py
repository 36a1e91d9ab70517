"""Settings from FLIPGATE_* variables."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from flipgate.processes import free_port
from service.config import Settings, get_settings
from tests.e2e.conftest import flipgate_env


def test_the_default_database_is_a_sqlite_file_in_the_data_dir(tmp_path):
    settings = Settings(data_dir=tmp_path)
    assert settings.database_url == f"sqlite:///{tmp_path.resolve() / 'flipgate.db'}"
    assert settings.max_upload_bytes == 512 * 2**20


def test_values_come_from_prefixed_environment_variables(monkeypatch):
    monkeypatch.setenv("FLIPGATE_DATABASE_URL", "postgresql+psycopg://u:pw@db/flipgate")
    monkeypatch.setenv("FLIPGATE_MAX_UPLOAD_MB", "7")
    settings = Settings()
    assert (settings.max_upload_mb, settings.safe_database_url) == (
        7, "postgresql+psycopg://u:***@db/flipgate")


@pytest.mark.parametrize("token", ["changethis", "short"])
def test_placeholder_secrets_are_refused_outside_development(token):
    assert Settings(admin_token=token).admin_token.get_secret_value() == token
    with pytest.raises(ValidationError, match="FLIPGATE_ADMIN_TOKEN"):
        Settings(environment="production", admin_token=token)
    Settings(environment="production", admin_token="a-real-secret-of-some-length")


def test_settings_are_read_once(monkeypatch):
    get_settings.cache_clear()
    monkeypatch.setenv("FLIPGATE_MAX_UPLOAD_MB", "3")
    first = get_settings()
    monkeypatch.setenv("FLIPGATE_MAX_UPLOAD_MB", "4")
    assert get_settings() is first and first.max_upload_mb == 3
    get_settings.cache_clear()


@pytest.mark.parametrize("keys", [{}, {"secret_key": "k" * 32}, {"session_key": "s" * 32}])
def test_an_s3_artifact_store_needs_the_shared_secret_and_session_keys(keys):
    with pytest.raises(ValidationError, match="FLIPGATE_SECRET_KEY and FLIPGATE_SESSION_KEY"):
        Settings(artifact_store="s3://bucket/prefix", **keys)
    assert Settings(artifact_store="s3://bucket", secret_key="k" * 32,
                    session_key="s" * 32).artifact_store == "s3://bucket"
    Settings(**keys)  # the local store needs neither


def test_single_sign_on_needs_a_client_id(monkeypatch):
    monkeypatch.setenv("FLIPGATE_OIDC_ISSUER", "https://id.example")
    with pytest.raises(ValidationError, match="FLIPGATE_OIDC_CLIENT_ID"):
        Settings()
    monkeypatch.setenv("FLIPGATE_OIDC_CLIENT_ID", "flipgate")
    assert (Settings().oidc_groups_claim, Settings().oidc_admin_group) == ("groups", None)


@pytest.mark.parametrize("command", [["serve", "--port", str(free_port())], ["migrate"],
                                     ["worker"]], ids=lambda command: command[0])
def test_server_commands_refuse_to_start_on_s3_without_the_keys_in_one_line(tmp_path,
                                                                             command):
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path), FLIPGATE_ARTIFACT_STORE="s3://bucket",
                       FLIPGATE_SECRET_KEY="secret-key-" + "k" * 21)
    started = subprocess.run([sys.executable, "-m", "flipgate.cli", *command], env=env,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 2
    assert started.stderr.count("\n") == 1, started.stderr  # no traceback
    assert started.stderr.startswith(f"flipgate {command[0]}: error: FLIPGATE_SECRET_KEY and ")
    assert "(missing: FLIPGATE_SESSION_KEY)" in started.stderr
    assert "secret-key-" not in started.stderr  # the refusal shows no key
    assert not (tmp_path / "flipgate.db").exists()
