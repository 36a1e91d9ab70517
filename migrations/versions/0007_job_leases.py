"""Jobs as leases and as outbox messages: the worker's heartbeat, the attempts made, and
when the broker last accepted the job's message; a callback's next delivery is due_at.

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-23 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import TIMESTAMP

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("heartbeat_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("sent_at", TIMESTAMP, nullable=True))
        batch.create_index("ix_jobs_state", ["state"])
    with op.batch_alter_table("gate_callbacks") as batch:
        batch.add_column(sa.Column("due_at", TIMESTAMP, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gate_callbacks") as batch:
        batch.drop_column("due_at")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_state")
        batch.drop_column("sent_at")
        batch.drop_column("heartbeat_at")
        batch.drop_column("attempts")
