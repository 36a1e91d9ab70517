"""API tokens may expire: api_tokens.expires_at (NULL: never).

Revision ID: 0004
Revises: 0002 (chained after 0003 when the branches are merged)
Create Date: 2026-11-23 05:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import TIMESTAMP

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("expires_at", TIMESTAMP, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")
