"""The migrations build exactly the schema the ORM models describe, on both backends."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from service.config import Settings
from service.db import create_db_engine
from service.migrate import DatabaseNotCurrent, check_current, head_revision
from service.tables import metadata
from tests.service.conftest import postgres_schema


def test_migrated_schema_equals_the_models(engine):
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []
        assert set(inspect(connection).get_table_names()) == set(metadata.tables) | {
            "alembic_version"}


def test_check_current_passes_after_upgrade(engine):
    check_current(engine)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_check_current_refuses_an_empty_database(backend, tmp_path):
    if backend == "sqlite":
        refuse_unmigrated(f"sqlite:///{tmp_path / 'empty.db'}")
        return
    with postgres_schema() as url:
        refuse_unmigrated(url)


def refuse_unmigrated(url: str) -> None:
    engine = create_db_engine(Settings(database_url=url))
    try:
        with pytest.raises(DatabaseNotCurrent, match=f"none.*needs {head_revision()}.*migrate"):
            check_current(engine)
    finally:
        engine.dispose()
