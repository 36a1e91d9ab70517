"""Settings from FLIPGATE_* variables."""

import pytest
from pydantic import ValidationError

from service.config import Settings, get_settings


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
