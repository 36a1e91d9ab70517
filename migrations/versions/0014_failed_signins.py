"""Failed dashboard sign-ins counted across API processes (issue 34): failed_signins keeps
one row per sign-in refused for its token, by client address, while it is inside the
throttle's window (rows that left it are deleted as new failures come in).

Revision ID: 0014_failed_signins
Revises: 0013
Create Date: 2026-11-27 08:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import TIMESTAMP

revision: str = "0014_failed_signins"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_failed_signins_client_failed_at"


def upgrade() -> None:
    op.create_table("failed_signins",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("client", sa.String(64), nullable=False),
                    sa.Column("failed_at", TIMESTAMP, nullable=False),
                    sa.PrimaryKeyConstraint("id", name=op.f("pk_failed_signins")))
    op.create_index(INDEX, "failed_signins", ["client", "failed_at"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="failed_signins")
    op.drop_table("failed_signins")
