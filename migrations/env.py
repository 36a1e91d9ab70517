"""Alembic environment: the target is Base.metadata and the URL comes from the settings."""

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from service.config import get_settings
from service.db import create_db_engine
from service.migrate import migrating
from service.tables import metadata

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def run(**configuration) -> None:
    """Run the migrations; batch mode always, so every revision also runs on SQLite."""
    context.configure(target_metadata=metadata, compare_type=True, render_as_batch=True,
                      **configuration)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Use the connection service.migrate hands over, or open one from the settings."""
    connection: Connection | None = config.attributes.get("connection")
    if connection is not None:
        run(connection=connection)
        return
    engine = create_db_engine(get_settings(), bound_round_trips=False)
    with migrating(engine) as connection:
        run(connection=connection)
    engine.dispose()


if context.is_offline_mode():
    run(url=get_settings().database_url, literal_binds=True)
else:
    run_online()
