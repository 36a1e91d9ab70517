"""`flipgate migrate` as a user runs it: the installed command in a fresh process."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from service.migrate import head_revision
from service.tables import metadata


def migrate(data_dir: Path) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")}
    command = Path(sys.executable).with_name("flipgate")
    return subprocess.run([command, "migrate"], env={**environment, "FLIPGATE_DATA_DIR":
                          str(data_dir)}, capture_output=True, text=True, timeout=120)


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
