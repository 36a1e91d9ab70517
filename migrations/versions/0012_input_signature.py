"""Every input of a version (issue 19): model_versions.inputs holds each input's name,
dtype and shape, so that versions of a line can be held to the same inputs and reports can
say which were fed. Existing versions are backfilled from their single input, which the
releases before multi-input models required to be float32.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSIONS = sa.table("model_versions", sa.column("id", sa.Integer()),
                    sa.column("input_name", sa.String(256)), sa.column("input_shape", JSON),
                    sa.column("inputs", JSON))


def upgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("inputs", JSON, nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(VERSIONS.c.id, VERSIONS.c.input_name, VERSIONS.c.input_shape)
                        .where(VERSIONS.c.input_name.is_not(None))).all()
    for row in rows:
        inputs = [{"name": row.input_name, "dtype": "float32", "shape": row.input_shape}]
        bind.execute(VERSIONS.update().where(VERSIONS.c.id == row.id).values(inputs=inputs))


def downgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.drop_column("inputs")
