"""Operations (issue 37): the request that queued a job (its X-Request-ID) and its trace
context on the job row, the gate request's id on its decision (its callback's X-Request-ID),
and the workers seen alive (each `flipgate worker`'s sweeper writes its beat). Rows stored
before have no request id.

Revision ID: 0015_request_ids
Revises: 0014_failed_signins
Create Date: 2026-11-27 08:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import TIMESTAMP

revision: str = "0015_request_ids"
down_revision: str | Sequence[str] | None = "0014_failed_signins"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("request_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("traceparent", sa.String(55), nullable=True))
    with op.batch_alter_table("gate_decisions") as batch:
        batch.add_column(sa.Column("request_id", sa.String(128), nullable=True))
    op.create_table("worker_beats",
                    sa.Column("name", sa.String(200), nullable=False),
                    sa.Column("queues", sa.String(200), nullable=False),
                    sa.Column("seen_at", TIMESTAMP, nullable=False),
                    sa.PrimaryKeyConstraint("name", name=op.f("pk_worker_beats")))


def downgrade() -> None:
    op.drop_table("worker_beats")
    with op.batch_alter_table("gate_decisions") as batch:
        batch.drop_column("request_id")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("traceparent")
        batch.drop_column("request_id")
