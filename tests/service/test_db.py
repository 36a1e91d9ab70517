"""Engines and session scopes as the server will use them."""

import pytest
from sqlalchemy import select

from service.config import Settings
from service.db import create_db_engine, create_session_factory
from service.errors import Conflict
from service.migrate import upgrade
from service.registry.models import ModelLine
from service.registry.service import create_line
from tests.service.conftest import default_session


def test_sqlite_connections_enforce_foreign_keys_and_use_wal(tmp_path):
    engine = create_db_engine(Settings(data_dir=tmp_path / "data"))
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()
    assert (tmp_path / "data" / "flipgate.db").is_file()


def test_session_scope_commits_on_success_and_rolls_back_on_error(tmp_path):
    settings = Settings(data_dir=tmp_path)
    upgrade(settings)
    engine = create_db_engine(settings)
    factory = create_session_factory(engine)
    with default_session(factory) as session:
        create_line(session=session, name="kept", num_classes=2)
    with pytest.raises(Conflict), default_session(factory) as session:
        create_line(session=session, name="dropped", num_classes=2)
        create_line(session=session, name="kept", num_classes=2)
    with default_session(factory) as session:
        assert session.scalars(select(ModelLine.name)).all() == ["kept"]
    engine.dispose()
