"""`flipgate token create|revoke` and `flipgate project create` on the server's database
write their audit events: the operating system's user, auth `cli`, in the same transaction
as the change."""

import getpass

import pytest
from sqlalchemy import select

from flipgate.cli import main
from service.audit.models import AuditEvent
from service.config import Settings, get_settings
from service.db import settings_session
from service.migrate import upgrade


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Settings:
    """An embedded data directory, migrated, that the commands find in the environment."""
    monkeypatch.setenv("FLIPGATE_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def trail(settings: Settings) -> list[tuple]:
    with settings_session(settings) as session:
        return [(row.actor, row.auth, row.project_id, row.action, row.resource, row.outcome)
                for row in session.scalars(select(AuditEvent).order_by(AuditEvent.id))]


def test_token_create_and_revoke_write_events(data_dir, capsys):
    upgrade(data_dir)
    assert main(["token", "create", "--name", "ci", "--scopes", "read"]) == 0
    assert main(["token", "create", "--name", "ops", "--scopes", "admin", "--server-level"]) == 0
    assert main(["token", "revoke", "ci"]) == 0
    assert main(["token", "revoke", "ops", "--server-level"]) == 0
    assert main(["token", "create", "--name", "ci", "--scopes", "read"]) == 2  # 409: nothing
    me = getpass.getuser()
    assert trail(data_dir) == [(me, "cli", 1, "token_create", "/tokens/ci", "ok"),
                               (me, "cli", None, "token_create", "/tokens/ops", "ok"),
                               (me, "cli", 1, "token_revoke", "/tokens/ci", "ok"),
                               (me, "cli", None, "token_revoke", "/tokens/ops", "ok")]


def test_project_create_writes_its_event_and_a_refused_one_none(data_dir, capsys):
    upgrade(data_dir)
    assert main(["project", "create", "team-b"]) == 0
    assert main(["project", "create", "team-b"]) == 2  # 409: nothing
    assert trail(data_dir) == [(getpass.getuser(), "cli", 2, "project_create",
                                "/projects/team-b", "ok")]
