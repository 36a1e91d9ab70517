"""Engine, sessions and the declarative base shared by every domain's ORM models."""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

# engines come from sqlalchemy.create_engine looked up when called: traces
# (service.observability.tracing) wrap it after this module is imported
import sqlalchemy
from sqlalchemy import (
    JSON,
    Connection,
    DateTime,
    Double,
    Engine,
    Enum,
    MetaData,
    Select,
    event,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from service.config import Settings
from service.errors import Conflict, NotFound

Row = TypeVar("Row")
WRITE_LOCK_AT_BEGIN = "flipgate_write_lock_at_begin"
SQLITE_BUSY_SECONDS = 30  # how long a SQLite transaction waits for another's write lock
POOL_SIZE, POOL_OVERFLOW = 10, 5  # pooled connections kept, and opened beyond them at peaks
CONNECT_SECONDS = 3  # a server that does not complete a connection by then is unavailable
POOL_WAIT_SECONDS = 5  # a request waits this long for a pooled connection, then 503

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Json = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores it without a zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    """Declarative base whose constraints get predictable names (Alembic can drop them)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UtcDateTime(), float: Double(), dict[str, Any]: Json,
    }


class Record:
    """Columns every table has: an integer id and the creation time."""

    id: Mapped[int] = mapped_column(primary_key=True, sort_order=-1)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def str_enum(enum_type: type[StrEnum], name: str) -> Enum:
    """A VARCHAR column that a CHECK constraint limits to the values of `enum_type`."""
    return Enum(enum_type, name=name, native_enum=False, create_constraint=True, length=32,
                values_callable=lambda members: [member.value for member in members])


def create_db_engine(settings: Settings, *, bound_round_trips: bool = True) -> Engine:
    """An engine for settings.database_url; SQLite gets foreign keys, WAL and real savepoints.
    With `bound_round_trips` (all but migrations, whose DDL may run long), a PostgreSQL round
    trip that gets no answer within settings.db_statement_seconds fails."""
    url = make_url(settings.database_url)
    if url.get_backend_name() != "sqlite":
        return _server_engine(url, settings.db_statement_seconds if bound_round_trips else None)
    pool: dict[str, int] = {}
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    engine = sqlalchemy.create_engine(url, connect_args={"timeout": SQLITE_BUSY_SECONDS},
                                      **pool)
    event.listen(engine, "connect", _configure_sqlite_connection)
    event.listen(engine, "begin", _begin_sqlite)
    return engine


def _server_engine(url: URL, round_trip_seconds: float | None) -> Engine:
    """A pooled engine whose connections open within CONNECT_SECONDS and, on psycopg with
    `round_trip_seconds`, whose every round trip ends within it (service.db_watchdog)."""
    engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE,
                                      max_overflow=POOL_OVERFLOW, pool_timeout=POOL_WAIT_SECONDS,
                                      connect_args={"connect_timeout": CONNECT_SECONDS})
    if round_trip_seconds is not None and url.get_driver_name() == "psycopg":
        from service.db_watchdog import bounded_connector  # SQLite never loads psycopg

        event.listen(engine, "do_connect", bounded_connector(round_trip_seconds))
    return engine


def _begin_sqlite(connection: Connection) -> None:
    """Emit BEGIN, or BEGIN IMMEDIATE on connections of session factories: the API and the
    workers are separate processes, and a SQLite transaction that has read cannot write
    after another process has committed ("database is locked"); taking the write lock at
    the start makes it wait for the other writer instead."""
    immediate = connection.get_execution_options().get(WRITE_LOCK_AT_BEGIN, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    """Let SQLAlchemy emit BEGIN (so SAVEPOINT works), enforce foreign keys, use WAL."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.close()


def create_session_factory(engine: Engine, *, writes: bool = True) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (responses are built afterwards);
    on SQLite the transactions of sessions that `writes` take the write lock when they
    begin, and those of sessions that only read begin without it (WAL readers wait for no
    writer), wherever their first query runs."""
    return sessionmaker(engine.execution_options(**{WRITE_LOCK_AT_BEGIN: writes}),
                        expire_on_commit=False)


def read_only(session: Session) -> None:
    """Begin the session's transaction without SQLite's write lock (WAL readers wait for no
    writer); for sessions that only read."""
    session.connection(execution_options={WRITE_LOCK_AT_BEGIN: False})


@contextmanager
def factory_connection(factory: sessionmaker[Session]) -> Iterator[Connection]:
    """A connection of the sessions of `factory`, for a Core statement that needs no session
    (a session's own transaction bookkeeping costs more than one short read): a new one of
    the factory's engine, closed when the block ends, or the connection the factory is bound
    to (the tests' shared one)."""
    bind = factory.kw["bind"]
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.connect() as connection:
        yield connection


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session in a transaction that commits when the block ends and rolls back on error."""
    with factory() as session, session.begin():
        yield session


@contextmanager
def settings_session(settings: Settings) -> Iterator[Session]:
    """A session_scope on the database of `settings`, for one-off commands."""
    engine = create_db_engine(settings)
    try:
        with session_scope(create_session_factory(engine)) as session:
            yield session
    finally:
        engine.dispose()


def one_or_not_found(session: Session, statement: Select[tuple[Row]], *, code: str,
                     message: str) -> Row:
    """The single row `statement` selects, or NotFound."""
    row = session.scalars(statement).one_or_none()
    if row is None:
        raise NotFound(code, message)
    return row


def insert_or_conflict(session: Session, row: Row, *, code: str, message: str) -> Row:
    """Add and flush `row` in a savepoint; a clash with a unique constraint becomes Conflict."""
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError as error:
        raise Conflict(code, message) from error
    return row
