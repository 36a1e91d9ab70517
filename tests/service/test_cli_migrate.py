"""`flipgate migrate` as a user runs it: the installed command in a fresh process."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from service.auth.service import create_token
from service.db import create_session_factory
from service.migrate import head_revision
from service.projects.service import create_project
from service.registry.service import create_line
from service.tables import metadata
from tests.service.conftest import default_session


def migrate(data_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")}
    command = Path(sys.executable).with_name("flipgate")
    return subprocess.run([command, "migrate", *flags], env={
        **environment, "FLIPGATE_DATA_DIR": str(data_dir)}, capture_output=True, text=True,
        timeout=120)


def schema(database: Path) -> list[tuple]:
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")
        return rows.fetchall()


@pytest.mark.slow
def test_migrate_creates_the_sqlite_database_and_then_does_nothing(tmp_path):
    first = migrate(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith(f"at revision {head_revision()}")
    database = tmp_path / "flipgate.db"
    created = schema(database)
    assert {name for kind, name, _ in created if kind == "table"} == {*metadata.tables,
                                                                      "alembic_version"}
    second = migrate(tmp_path)
    assert (second.returncode, second.stdout) == (0, first.stdout)
    assert schema(database) == created


@pytest.mark.slow
def test_a_downgrade_that_merges_projects_is_refused_without_the_flag(tmp_path):
    assert migrate(tmp_path).returncode == 0
    engine = create_engine(f"sqlite:///{tmp_path / 'flipgate.db'}")
    with default_session(create_session_factory(engine)) as session:
        create_line(session=session, name="fraud", num_classes=2)
        create_project(session=session, name="team-b")
        create_token(session=session, name="b-ci", scopes=["read"], project="team-b")
    engine.dispose()
    refused = migrate(tmp_path, "--to", "0016_traffic_sets")
    assert refused.returncode == 2
    assert refused.stderr.startswith("flipgate migrate: error: cannot downgrade below "
                                     "0017_projects without merging projects: the projects "
                                     "'default', 'team-b' would be merged")
    assert len(refused.stderr.splitlines()) == 1
    merged = migrate(tmp_path, "--to", "0016_traffic_sets", "--merge-projects")
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.strip().endswith("at revision 0016_traffic_sets")
    unknown = migrate(tmp_path, "--to", "no_such_revision")
    assert unknown.returncode == 2 and "no_such_revision" in unknown.stderr
