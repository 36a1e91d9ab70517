"""Projects (issue 35): a project owns lines, data sets, jobs and decisions (`project_id` on
each; line, data set and token names are unique per project), roles are granted to groups
or OpenID subjects (`project_members`), people signed in with OpenID Connect are kept with
their last claims (`people`), and every change or refusal is an `audit_events` row.

Upgrading moves every existing row into the project `default` and binds every existing
token to it with the scopes it had, so every CI job keeps working unchanged.

Revision ID: 0017_projects
Revises: 0016_traffic_sets
Create Date: 2026-11-27 11:00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from migrations.helpers import (
    JSON,
    NAME,
    TIMESTAMP,
    foreign_key,
    operator_agreed,
    record_table,
)
from service.migrate import MERGE_PROJECTS, MigrationRefused

revision: str = "0017_projects"
down_revision: str | Sequence[str] | None = "0016_traffic_sets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT = "default"
PRINCIPAL = sa.String(length=255)
EMAIL = sa.String(length=320)
OWNED = ("model_lines", "datasets", "jobs", "gate_decisions")  # project_id NOT NULL
NAMED = ("model_lines", "datasets", "api_tokens")  # names unique per project


def upgrade() -> None:
    record_table("projects", sa.Column("name", NAME, nullable=False),
                 constraints=[sa.UniqueConstraint("name", name=op.f("uq_projects_name"))])
    projects = sa.table("projects", sa.column("name", NAME), sa.column("created_at", TIMESTAMP))
    op.bulk_insert(projects, [{"name": DEFAULT, "created_at": datetime.now(UTC)}])
    default_id = op.get_bind().execute(sa.text("SELECT id FROM projects WHERE name = :name"),
                                       {"name": DEFAULT}).scalar_one()
    for table in (*OWNED, "api_tokens"):
        _add_project(table, default_id, nullable=table == "api_tokens")
    for table in NAMED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"uq_{table}_name"), type_="unique")
            batch.create_unique_constraint(op.f(f"uq_{table}_project_id_name"),
                                           ["project_id", "name"])
    op.create_index("uq_api_tokens_server_name", "api_tokens", ["name"], unique=True,
                    sqlite_where=sa.text("project_id IS NULL"),
                    postgresql_where=sa.text("project_id IS NULL"))
    _create_membership_and_audit()


def _add_project(table: str, default_id: int, *, nullable: bool) -> None:
    """projects.id column on `table`, every existing row in the project `default`."""
    with op.batch_alter_table(table) as batch:
        batch.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
    op.execute(sa.text(f"UPDATE {table} SET project_id = :project").bindparams(
        project=default_id))
    with op.batch_alter_table(table) as batch:
        if not nullable:
            batch.alter_column("project_id", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(op.f(f"fk_{table}_project_id_projects"), "projects",
                                 ["project_id"], ["id"])
        batch.create_index(op.f(f"ix_{table}_project_id"), ["project_id"])


def _create_membership_and_audit() -> None:
    record_table(
        "project_members",
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("principal", PRINCIPAL, nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        constraints=[foreign_key("project_members", "project_id", "projects"),
                     sa.UniqueConstraint("project_id", "kind", "principal",
                                         name=op.f("uq_project_members_project_id_kind_principal"))])
    op.create_index(op.f("ix_project_members_project_id"), "project_members", ["project_id"])
    op.create_table(
        "people",
        sa.Column("subject", PRINCIPAL, nullable=False),
        sa.Column("email", EMAIL, nullable=True),
        sa.Column("display_name", PRINCIPAL, nullable=True),
        sa.Column("groups", JSON, nullable=False),
        sa.Column("signed_in_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("subject", name=op.f("pk_people")))
    record_table(
        "audit_events",
        sa.Column("actor", PRINCIPAL, nullable=False),
        sa.Column("actor_email", EMAIL, nullable=True),
        sa.Column("auth", sa.String(length=16), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", NAME, nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("client", sa.String(length=64), nullable=True),
        sa.Column("details", JSON, nullable=True),
        constraints=[foreign_key("audit_events", "project_id", "projects")])
    op.create_index("ix_audit_events_project_id_id", "audit_events", ["project_id", "id"])


def downgrade() -> None:
    """Back to one namespace: every project's lines, data sets and tokens in it; refused,
    before any change, while two projects (or a project and the server) hold the same name,
    and while two projects hold anything unless the operator agreed to merge them
    (MERGE_PROJECTS). The projects, their members, the people and the audit trail are
    dropped."""
    _refuse_shared_names()
    _refuse_merging_projects()
    op.drop_table("audit_events")
    op.drop_table("people")
    op.drop_table("project_members")
    op.drop_index("uq_api_tokens_server_name", table_name="api_tokens")
    for table in NAMED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"uq_{table}_project_id_name"), type_="unique")
            batch.create_unique_constraint(op.f(f"uq_{table}_name"), ["name"])
    for table in (*OWNED, "api_tokens"):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(op.f(f"ix_{table}_project_id"))
            batch.drop_constraint(op.f(f"fk_{table}_project_id_projects"), type_="foreignkey")
            batch.drop_column("project_id")
    op.drop_table("projects")


def _refuse_shared_names() -> None:
    """Raise unless every line, data set and token name is held once: one namespace could
    not hold them all (and its unique constraints would fail halfway)."""
    bind = op.get_bind()
    shared = {table: bind.execute(sa.text(f"SELECT name FROM {table} GROUP BY name "
                                          "HAVING COUNT(*) > 1 ORDER BY name")).scalars().all()
              for table in NAMED}
    if any(shared.values()):
        held = "; ".join(f"{table}: {', '.join(map(repr, names))}"
                         for table, names in shared.items() if names)
        raise MigrationRefused("names_shared", f"cannot downgrade below {revision}: rename or "
                               "delete what would share a name first; held by several "
                               f"projects: {held}")


def _refuse_merging_projects() -> None:
    """Raise, unless the operator agreed, while more than one project holds a line, a data
    set, a job, a decision or a token: below this revision they would be one namespace, and
    every token would act on every project's objects."""
    holding = " UNION ".join(f"SELECT project_id FROM {table}" for table in (*OWNED,
                                                                            "api_tokens"))
    projects = op.get_bind().execute(sa.text(
        f"SELECT name FROM projects WHERE id IN ({holding}) ORDER BY name")).scalars().all()
    if len(projects) > 1 and not operator_agreed(MERGE_PROJECTS):
        raise MigrationRefused("projects_would_merge", (
            f"cannot downgrade below {revision} without merging projects: the projects "
            f"{', '.join(map(repr, projects))} would be merged into one namespace, every "
            "project's lines, data sets, jobs and decisions in it and every project's tokens "
            f"acting on all of them; to merge them, run `flipgate migrate --to {down_revision} "
            f"--merge-projects` (alembic: -x {MERGE_PROJECTS}=yes)"))
