"""A line's matrix from compact counts: one pair_counts row per unordered pair of versions on
a data set, stored by the new `matrix` job kind from the versions' predicted classes. Nothing
is filled in: the next POST /models/{name}/matrix, or the next logits stored for one of a
line's versions, queues the job that stores a line's counts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import foreign_key, record_table, string_enum

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_KINDS = ("inference", "metrics", "train")
COUNTS = ("n", "only_first_right", "only_second_right", "differ")


def upgrade() -> None:
    record_table(
        "pair_counts",
        *(sa.Column(name, sa.Integer(), nullable=False)
          for name in ("first_version_id", "second_version_id", "dataset_id")),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in COUNTS),
        constraints=[
            sa.CheckConstraint("first_version_id < second_version_id",
                               name=op.f("ck_pair_counts_ordered")),
            foreign_key("pair_counts", "dataset_id", "datasets"),
            foreign_key("pair_counts", "first_version_id", "model_versions"),
            foreign_key("pair_counts", "second_version_id", "model_versions"),
            sa.UniqueConstraint(
                "first_version_id", "second_version_id", "dataset_id",
                name=op.f("uq_pair_counts_first_version_id_second_version_id_dataset_id")),
        ],
    )
    op.create_index(op.f("ix_pair_counts_dataset_id"), "pair_counts", ["dataset_id"])
    _job_kinds(JOB_KINDS, (*JOB_KINDS, "matrix"))


def downgrade() -> None:
    op.execute("DELETE FROM job_dependencies WHERE job_id IN "
               "(SELECT id FROM jobs WHERE kind = 'matrix') OR waits_for_id IN "
               "(SELECT id FROM jobs WHERE kind = 'matrix')")
    op.execute("DELETE FROM jobs WHERE kind = 'matrix'")
    _job_kinds((*JOB_KINDS, "matrix"), JOB_KINDS)
    op.drop_index(op.f("ix_pair_counts_dataset_id"), table_name="pair_counts")
    op.drop_table("pair_counts")


def _job_kinds(old: Sequence[str], new: Sequence[str]) -> None:
    """Let jobs.kind take the values `new` (its CHECK constraint rewritten)."""
    if op.get_bind().dialect.name == "sqlite":
        _rewrite_sqlite_check(_kind_check(old), _kind_check(new))
        return
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("kind", existing_type=string_enum("job_kind", *old),
                           type_=string_enum("job_kind", *new), existing_nullable=False)


def _kind_check(kinds: Sequence[str]) -> str:
    """The text of the CHECK on jobs.kind, as the table's definition holds it."""
    return "kind IN ({})".format(", ".join(f"'{kind}'" for kind in kinds))


def _rewrite_sqlite_check(old: str, new: str) -> None:
    """Replace a CHECK of the jobs table in its stored definition, in this transaction.

    SQLite cannot alter a constraint, and rebuilding jobs fails while job_dependencies,
    decision_jobs and shards point at its rows (foreign keys are enforced and cannot be
    turned off inside a transaction). A CHECK whose rows all stay valid is rewritten in
    sqlite_schema instead, the procedure SQLite documents for such changes
    (https://www.sqlite.org/lang_altertable.html#otheralter): writable_schema, the new text,
    schema_version + 1.
    """
    bind = op.get_bind()
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.execute(sa.text("UPDATE sqlite_schema SET sql = replace(sql, :old, :new) "
                         "WHERE type = 'table' AND name = 'jobs'"), {"old": old, "new": new})
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    stored = bind.execute(sa.text("SELECT sql FROM sqlite_schema WHERE name = 'jobs'")).scalar()
    if new not in stored:
        raise RuntimeError(f"jobs has no CHECK {old!r} to rewrite: {stored}")
