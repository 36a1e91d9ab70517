"""The MLflow connector: its log of deliveries and actions (mlflow_events) and the `mlflow`
job kind.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import NAME, job_kinds, record_table

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_KINDS = ("inference", "metrics", "train", "matrix")


def upgrade() -> None:
    record_table(
        "mlflow_events",
        sa.Column("delivery_id", sa.String(length=200), nullable=True),
        sa.Column("model", NAME, nullable=False),
        sa.Column("alias", NAME, nullable=False),
        sa.Column("version", NAME, nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        constraints=[sa.UniqueConstraint("delivery_id",
                                         name=op.f("uq_mlflow_events_delivery_id"))],
    )
    op.create_index(op.f("ix_mlflow_events_model"), "mlflow_events", ["model"])
    job_kinds(JOB_KINDS, (*JOB_KINDS, "mlflow"))


def downgrade() -> None:
    op.execute("DELETE FROM job_dependencies WHERE job_id IN "
               "(SELECT id FROM jobs WHERE kind = 'mlflow') OR waits_for_id IN "
               "(SELECT id FROM jobs WHERE kind = 'mlflow')")
    op.execute("DELETE FROM jobs WHERE kind = 'mlflow'")
    job_kinds((*JOB_KINDS, "mlflow"), JOB_KINDS)
    op.drop_index(op.f("ix_mlflow_events_model"), table_name="mlflow_events")
    op.drop_table("mlflow_events")
