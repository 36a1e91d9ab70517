"""Column types and table helpers shared by the revisions (mirroring service.db)."""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
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
