"""Applying and checking the Alembic revisions kept in migrations/.

migrations/ sits beside this package, both in a checkout and in an installed wheel (it is
packaged as a top-level package of the distribution), so its path is computed from here.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from service.config import Settings
from service.db import create_db_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


MERGE_PROJECTS = "merge_projects"  # the operator's consent to a downgrade that merges projects


class DatabaseNotCurrent(RuntimeError):
    """The database schema is not the one this code expects."""


class MigrationRefused(RuntimeError):
    """A revision refused to run, before changing anything (`code` says why)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic configuration for migrations/, running on `connection` when given."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision in migrations/."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, None when it was never migrated."""
    return MigrationContext.configure(connection).get_current_revision()


@contextmanager
def migrating(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction to migrate in, committed when the block ends.

    On SQLite, foreign keys are not enforced inside it: batch mode rebuilds a table by
    copying it and dropping the original, and dropping a table that other rows point at
    fails while they are enforced, which cannot be turned off inside a transaction. So,
    as SQLite documents (https://www.sqlite.org/lang_altertable.html#otheralter), they are
    turned off before it begins, checked with `foreign_key_check` before the commit (a
    violation rolls everything back) and turned on again afterwards."""
    with engine.connect() as connection:
        sqlite = engine.dialect.name == "sqlite"
        if sqlite:
            connection.connection.dbapi_connection.execute("PRAGMA foreign_keys = OFF")
        try:
            with connection.begin():
                yield connection
                if sqlite:
                    _check_foreign_keys(connection)
        finally:
            if sqlite:
                connection.connection.dbapi_connection.execute("PRAGMA foreign_keys = ON")


def _check_foreign_keys(connection: Connection) -> None:
    violations = connection.execute(text("PRAGMA foreign_key_check")).all()
    if violations:
        raise RuntimeError(f"the migration left rows whose foreign keys point at no row "
                           f"(table, rowid, parent, key): {violations[:10]}")


def upgrade(settings: Settings) -> str:
    """Bring the database of `settings` to the newest revision and return that revision."""
    return migrate_to(settings, "head")


def migrate_to(settings: Settings, revision: str, *, merge_projects: bool = False) -> str:
    """Upgrade or downgrade the database of `settings` to `revision` and return the revision
    it is at; a downgrade below 0017 merges projects only with `merge_projects`."""
    engine = create_db_engine(settings, bound_round_trips=False)
    try:
        with migrating(engine) as connection:
            config = alembic_config(connection)
            config.attributes["settings"] = settings  # revisions that need the server key
            config.attributes[MERGE_PROJECTS] = merge_projects
            below = _is_below(revision, current_revision(connection))
            (command.downgrade if below else command.upgrade)(config, revision)
            return current_revision(connection)
    finally:
        engine.dispose()


def _is_below(revision: str, current: str | None) -> bool:
    """Whether reaching `revision` from `current` is a downgrade (CommandError when
    migrations/ has no such revision)."""
    if current is None or revision == "base":
        return current is not None
    script = ScriptDirectory.from_config(alembic_config())
    target = script.get_revision(revision).revision
    return target != current and target in {
        step.revision for step in script.iterate_revisions(current, "base")}


def check_current(engine: Engine) -> None:
    """Refuse a database that is not at the newest revision (checked at start-up)."""
    with engine.connect() as connection:
        current = current_revision(connection)
    head = head_revision()
    if current != head:
        raise DatabaseNotCurrent(f"the database is at revision {current or 'none (empty)'} "
                                 f"but this flipgate needs {head}; run `flipgate migrate`")
