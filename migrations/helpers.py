"""Column types and table helpers shared by the revisions (mirroring service.db)."""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
NAME = sa.String(length=100)
SHA256 = sa.String(length=64)


def record_table(table: str, *columns: sa.Column, constraints: Sequence = ()) -> None:
    """Create `table` with an integer id first and created_at last, as service.db.Record."""
    op.create_table(
        table,
        sa.Column("id", sa.Integer(), nullable=False),
        *columns,
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
        *constraints,
    )


def foreign_key(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"],
                                   name=op.f(f"fk_{table}_{column}_{target}"))


def string_enum(name: str, *values: str) -> sa.Enum:
    """A VARCHAR(32) checked against `values` (service.db.str_enum)."""
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=32)


def job_kinds(old: Sequence[str], new: Sequence[str]) -> None:
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


def operator_agreed(option: str) -> bool:
    """Whether the operator passed `option`: `flipgate migrate`'s flag (service.migrate sets
    it in the configuration's attributes) or alembic's `-x option=yes`."""
    return (bool(op.get_context().config.attributes.get(option))
            or context.get_x_argument(as_dictionary=True).get(option) == "yes")
