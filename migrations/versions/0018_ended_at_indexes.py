"""Indexes on when a job ended and when a decision became final (issue 43): `GET /metrics`
reads the rows that ended since its last scrape through them, not the whole history
(service.metrics.collector).

Revision ID: 0018_ended_at_indexes
Revises: 0017_projects
Create Date: 2026-11-28 14:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018_ended_at_indexes"
down_revision: str | Sequence[str] | None = "0017_projects"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"jobs": "finished_at", "gate_decisions": "decided_at"}


def upgrade() -> None:
    for table, column in INDEXES.items():
        op.create_index(op.f(f"ix_{table}_{column}"), table, [column])


def downgrade() -> None:
    for table, column in INDEXES.items():
        op.drop_index(op.f(f"ix_{table}_{column}"), table_name=table)
