"""The migrations build exactly the schema the ORM models describe, on both backends."""

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, column, inspect, select, table, text
from sqlalchemy.exc import IntegrityError

from service.auth.service import create_token
from service.config import Settings
from service.datasets.models import Dataset, DatasetRole
from service.db import Json, create_db_engine, create_session_factory, utcnow
from service.migrate import (
    DatabaseNotCurrent,
    MigrationRefused,
    alembic_config,
    check_current,
    current_revision,
    head_revision,
    migrate_to,
)
from service.projects.service import create_project
from service.registry.service import create_line
from service.tables import metadata
from tests.service.conftest import default_session, postgres_schema

BEFORE_PROJECTS = "0016_traffic_sets"
BEFORE_VERSION_PROJECT = "0018_ended_at_indexes"
BEFORE_MULTILABEL = "0019_version_project"
EVENTS = table("audit_events", column("actor"), column("auth"), column("project_id"),
               column("action"), column("resource"), column("outcome"),
               column("details", Json), column("created_at"))
TOKENS = table("api_tokens", column("name"), column("owner"), column("owner_groups", Json))


def test_migrated_schema_equals_the_models(engine):
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []
        assert set(inspect(connection).get_table_names()) == set(metadata.tables) | {
            "alembic_version"}


def test_check_current_passes_after_upgrade(engine):
    check_current(engine)


@contextmanager
def empty_database(backend: str, folder: Path) -> Iterator[Engine]:
    """An engine on an empty database of `backend` (a SQLite file in `folder`), disposed
    afterwards."""
    with ExitStack() as stack:
        url = (f"sqlite:///{folder / 'empty.db'}" if backend == "sqlite"
               else stack.enter_context(postgres_schema()))
        engine = create_db_engine(Settings(database_url=url))
        stack.callback(engine.dispose)
        yield engine


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_check_current_refuses_an_empty_database(backend, tmp_path):
    with (empty_database(backend, tmp_path) as engine,
          pytest.raises(DatabaseNotCurrent, match=f"none.*needs {head_revision()}.*migrate")):
        check_current(engine)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0003_moves_after_lists_into_job_dependencies_and_back(backend, tmp_path):
    """Jobs stored at revision 0002 with params "after" wait for the same jobs at 0003."""
    jobs = table("jobs", column("id"), column("kind"), column("state"), column("progress"),
                 column("params", Json), column("created_at"))
    params = [{"version_id": 1}, {"version_id": 2},
              {"old_version_id": 1, "new_version_id": 2, "evalset": "e", "after": [1, 2]}]
    with empty_database(backend, tmp_path) as engine, engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0002")
        connection.execute(jobs.insert(), [
            {"id": index + 1, "kind": "inference" if index < 2 else "metrics",
             "state": "queued", "progress": 0.0, "params": value, "created_at": utcnow()}
            for index, value in enumerate(params)])
        command.upgrade(alembic_config(connection), "0003")
        assert connection.execute(select(jobs.c.params).where(jobs.c.id == 3)).scalar() == {
            "old_version_id": 1, "new_version_id": 2, "evalset": "e"}
        assert connection.execute(text(
            "SELECT job_id, waits_for_id FROM job_dependencies ORDER BY waits_for_id")
        ).all() == [(3, 1), (3, 2)]
        command.downgrade(alembic_config(connection), "0002")
        assert connection.execute(select(jobs.c.params).where(jobs.c.id == 3)).scalar() == (
            params[2])


def insert_job(connection, job_id: int, kind: str, parent_id: int | None = None) -> None:
    connection.execute(text(
        "INSERT INTO jobs (id, kind, state, progress, params, parent_id, created_at, attempts) "
        "VALUES (:id, :kind, 'queued', 0, '{}', :parent_id, CURRENT_TIMESTAMP, 0)"),
        {"id": job_id, "kind": kind, "parent_id": parent_id})


def stored_jobs(connection) -> list[tuple]:
    return [*connection.execute(text("SELECT id, kind, parent_id FROM jobs ORDER BY id")),
            *connection.execute(text("SELECT job_id, waits_for_id FROM job_dependencies "
                                     "ORDER BY job_id"))]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0008_lets_jobs_be_matrix_jobs_and_keeps_the_jobs_stored_before(backend, tmp_path):
    """Jobs, shards and dependencies stored at 0007 stay as they are through 0008 and back (on
    SQLite the jobs table is not rebuilt under the rows that point at it); `matrix` jobs are
    refused before 0008, accepted after, and removed with pair_counts by its downgrade."""
    with empty_database(backend, tmp_path) as engine, engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0007")
        for job_id, kind, parent_id in ((1, "inference", None), (2, "inference", 1),
                                        (3, "metrics", None)):
            insert_job(connection, job_id, kind, parent_id)
        connection.execute(text("INSERT INTO job_dependencies VALUES (3, 1)"))
        before = stored_jobs(connection)
        with pytest.raises(IntegrityError), connection.begin_nested():
            insert_job(connection, 4, "matrix")
        command.upgrade(alembic_config(connection), "0008")
        assert stored_jobs(connection) == before
        insert_job(connection, 4, "matrix")
        connection.execute(text("INSERT INTO job_dependencies VALUES (4, 1)"))
        assert "pair_counts" in inspect(connection).get_table_names()
        command.downgrade(alembic_config(connection), "0007")
        assert stored_jobs(connection) == before
        assert "pair_counts" not in inspect(connection).get_table_names()
        with pytest.raises(IntegrityError), connection.begin_nested():
            insert_job(connection, 4, "matrix")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0012_backfills_each_versions_inputs_from_its_single_input(backend, tmp_path):
    """Versions stored at 0011 (one float32 input, or none for an external version) get that
    input in `inputs` at 0012; the downgrade drops the column and keeps the versions."""
    lines = table("model_lines", column("id"), column("name"), column("num_classes"),
                  column("created_at"))
    versions = table("model_versions", column("id"), column("line_id"), column("version"),
                     column("artifact_sha256"), column("input_name"),
                     column("input_shape", Json), column("num_classes"),
                     column("metadata", Json), column("created_at"), column("inputs", Json))
    stored = [{"id": 1, "input_name": "pixels", "input_shape": [None, 28, 28],
               "artifact_sha256": "a" * 64},
              {"id": 2, "input_name": None, "input_shape": None, "artifact_sha256": None}]
    with empty_database(backend, tmp_path) as engine, engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0011")
        connection.execute(lines.insert(), [{"id": 1, "name": "digits", "num_classes": 10,
                                             "created_at": utcnow()}])
        connection.execute(versions.insert(), [
            {**row, "line_id": 1, "version": str(row["id"]), "num_classes": 10, "metadata": {},
             "created_at": utcnow()} for row in stored])
        command.upgrade(alembic_config(connection), "0012")
        assert connection.execute(select(versions.c.id, versions.c.inputs)
                                  .order_by(versions.c.id)).all() == [
            (1, [{"name": "pixels", "dtype": "float32", "shape": [None, 28, 28]}]), (2, None)]
        command.downgrade(alembic_config(connection), "0011")
        assert connection.execute(select(versions.c.id, versions.c.input_name)
                                  .order_by(versions.c.id)).all() == [(1, "pixels"), (2, None)]


VERSIONS = table("model_versions", column("id"), column("line_id"), column("version"),
                 column("num_classes"), column("metadata", Json), column("created_at"))


def stored_versions(connection, *columns: str) -> list[tuple]:
    return connection.execute(text(f"SELECT {', '.join(columns)} FROM model_versions "
                                   "ORDER BY id")).all()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0019_gives_each_version_its_lines_project_and_no_other(backend, tmp_path):
    """Versions stored at 0018 in two projects hold their line's project at 0019, where a
    version whose project is not its line's is refused; the downgrade keeps every version."""
    with empty_database(backend, tmp_path) as engine:
        settings = Settings(database_url=engine.url.render_as_string(hide_password=False))
        migrate_to(settings, BEFORE_VERSION_PROJECT)
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO projects (name, created_at) VALUES "
                                    "('team-b', CURRENT_TIMESTAMP)"))
            projects = dict(connection.execute(text("SELECT name, id FROM projects")).all())
            connection.execute(text(
                "INSERT INTO model_lines (id, name, num_classes, project_id, created_at) "
                "VALUES (1, 'fraud', 2, :a, CURRENT_TIMESTAMP), "
                "(2, 'fraud', 2, :b, CURRENT_TIMESTAMP)"),
                {"a": projects["default"], "b": projects["team-b"]})
            connection.execute(VERSIONS.insert(), [
                {"id": number, "line_id": line, "version": str(number), "num_classes": 2,
                 "metadata": {}, "created_at": utcnow()}
                for number, line in ((1, 1), (2, 2), (3, 2))])
            before = stored_versions(connection, "id", "line_id", "version")
        migrate_to(settings, "head")
        with engine.begin() as connection:
            assert stored_versions(connection, "id", "project_id") == [
                (1, projects["default"]), (2, projects["team-b"]), (3, projects["team-b"])]
            with pytest.raises(IntegrityError), connection.begin_nested():
                connection.execute(text("UPDATE model_versions SET project_id = :b WHERE id = 1"),
                                   {"b": projects["team-b"]})
        migrate_to(settings, BEFORE_VERSION_PROJECT)
        with engine.connect() as connection:
            assert stored_versions(connection, "id", "line_id", "version") == before
            assert "project_id" not in {column["name"] for column in
                                        inspect(connection).get_columns("model_versions")}


def minted_before_owners(connection) -> None:
    """At 0020: heidi's personal token person-heidi-1 (an `ok` mint event of hers names it),
    a look-alike the API minted (person-heidi-9, no event), and a mint she was refused."""
    default = connection.execute(text("SELECT id FROM projects WHERE name = 'default'")
                                 ).scalar_one()
    connection.execute(table("people", column("subject"), column("groups", Json),
                             column("signed_in_at")).insert(),
                       [{"subject": "heidi", "groups": ["ml-team"], "signed_in_at": utcnow()}])
    connection.execute(table("api_tokens", column("name"), column("token_hash"),
                             column("scopes", Json), column("project_id"),
                             column("created_at")).insert(),
                       [{"name": name, "token_hash": f"{name}-hash", "scopes": ["read"],
                         "project_id": default, "created_at": utcnow()}
                        for name in ("person-heidi-1", "person-heidi-9", "ci")])
    connection.execute(EVENTS.insert(), [
        {"actor": "heidi", "auth": "oidc", "project_id": default,
         "action": "mint_personal_token", "resource": "/ui/tokens", "outcome": outcome,
         "details": {"name": name}, "created_at": utcnow()}
        for outcome, name in (("ok", "person-heidi-1"), ("denied", "ci"))])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0021_gives_each_personal_token_the_owner_its_mint_event_names(backend, tmp_path):
    """Tokens stored at 0020 hold their owner (and the owner's groups) at 0021 where an `ok`
    mint event of a person names them, else none; the downgrade keeps every token."""
    with empty_database(backend, tmp_path) as engine:
        settings = Settings(database_url=engine.url.render_as_string(hide_password=False))
        migrate_to(settings, "0020_multilabel")
        with engine.begin() as connection:
            minted_before_owners(connection)
        migrate_to(settings, "head")
        with engine.connect() as connection:
            owners = connection.execute(select(TOKENS.c.name, TOKENS.c.owner,
                                               TOKENS.c.owner_groups)
                                        .order_by(TOKENS.c.name)).all()
        assert owners == [("ci", None, None), ("person-heidi-1", "heidi", ["ml-team"]),
                          ("person-heidi-9", None, None)]
        migrate_to(settings, "0020_multilabel")
        with engine.connect() as connection:
            assert connection.execute(text("SELECT name FROM api_tokens ORDER BY name")
                                      ).scalars().all() == ["ci", "person-heidi-1",
                                                            "person-heidi-9"]
            assert "owner" not in {column["name"] for column in
                                   inspect(connection).get_columns("api_tokens")}


def projects_holding(engine: Engine, *, team_b_token: bool) -> Settings:
    """The database migrated to the newest revision: a line in `default` and the project
    team-b, holding a token when `team_b_token`; the settings that reach it."""
    settings = Settings(database_url=engine.url.render_as_string(hide_password=False))
    migrate_to(settings, "head")
    with default_session(create_session_factory(engine)) as session:
        create_line(session=session, name="fraud", num_classes=2)
        create_project(session=session, name="team-b")
        if team_b_token:
            create_token(session=session, name="b-ci", scopes=["read"], project="team-b")
    return settings


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_downgrade_that_merges_projects_needs_the_operators_consent(backend, tmp_path):
    """Below 0017 there are no projects: two projects that each hold something, whatever its
    name, would become one namespace, team-b's token reading default's line. Refused before
    anything changes; done with merge_projects (`flipgate migrate --merge-projects`)."""
    with empty_database(backend, tmp_path) as engine:
        settings = projects_holding(engine, team_b_token=True)
        with pytest.raises(MigrationRefused, match=r"the projects 'default', 'team-b' would be "
                           r"merged into one namespace.*--merge-projects") as refused:
            migrate_to(settings, BEFORE_PROJECTS)
        assert refused.value.code == "projects_would_merge"
        with engine.connect() as connection:
            assert current_revision(connection) == head_revision()
        assert migrate_to(settings, BEFORE_PROJECTS, merge_projects=True) == BEFORE_PROJECTS
        with engine.connect() as connection:
            assert "projects" not in inspect(connection).get_table_names()
            assert connection.execute(text("SELECT name FROM api_tokens")).scalars().all() == [
                "b-ci"]
        assert migrate_to(settings, "head") == head_revision()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_downgrade_that_merges_nothing_needs_no_consent(backend, tmp_path):
    """One project holds everything (team-b is empty): nothing is merged."""
    with empty_database(backend, tmp_path) as engine:
        settings = projects_holding(engine, team_b_token=False)
        assert migrate_to(settings, BEFORE_PROJECTS) == BEFORE_PROJECTS


def multilabel_rows_stored(engine: Engine) -> Settings:
    """The database at the newest revision holding a single-label line, a multi-label line
    and a multi-label eval set in `default`; the settings that reach it."""
    settings = Settings(database_url=engine.url.render_as_string(hide_password=False))
    migrate_to(settings, "head")
    with default_session(create_session_factory(engine)) as session:
        create_line(session=session, name="fraud", num_classes=2)
        create_line(session=session, name="tags", num_classes=3, multilabel=True)
        session.add(Dataset(name="tags-eval", role=DatasetRole.EVAL, sha256="0" * 64, n=5,
                            num_classes=3, sample_shape=[4], multilabel=True,
                            label_names=["a", "b", "c"]))
    return settings


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_downgrade_below_0020_is_refused_while_multilabel_rows_are_stored(backend, tmp_path):
    """Below 0020 a multi-label line or set would pass for single-label: refused before
    anything changes (0021's downgrade, run first, undone too); once they are gone, the
    downgrade keeps the single-label line."""
    with empty_database(backend, tmp_path) as engine:
        settings = multilabel_rows_stored(engine)
        with pytest.raises(MigrationRefused, match=r"cannot downgrade below 0020_multilabel.*"
                           r"model_lines: 'default/tags'; datasets: 'default/tags-eval'"
                           ) as refused:
            migrate_to(settings, BEFORE_MULTILABEL)
        assert refused.value.code == "multilabel_data_stored"
        with engine.begin() as connection:
            assert current_revision(connection) == head_revision()
            assert "owner" in {column["name"] for column in
                               inspect(connection).get_columns("api_tokens")}
            assert connection.execute(text("SELECT name FROM model_lines WHERE multilabel")
                                      ).scalars().all() == ["tags"]
            for stored in ("model_lines", "datasets"):
                connection.execute(text(f"DELETE FROM {stored} WHERE multilabel"))
        assert migrate_to(settings, BEFORE_MULTILABEL) == BEFORE_MULTILABEL
        with engine.connect() as connection:
            assert connection.execute(text("SELECT name FROM model_lines")).scalars().all() == [
                "fraud"]
