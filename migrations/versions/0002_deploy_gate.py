"""The deploy gate: policies, webhook secrets, decisions and the jobs they wait for,
callbacks, promotions, and a line's training data set.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 10:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON, NAME, TIMESTAMP, foreign_key, record_table, string_enum

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("model_lines") as batch:
        batch.add_column(sa.Column("training_dataset_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_model_lines_training_dataset_id_datasets"),
                                 "datasets", ["training_dataset_id"], ["id"])
    record_table(
        "gate_policies",
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("rules", JSON, nullable=False),
        sa.Column("created_by", NAME, nullable=False),
        constraints=[foreign_key("gate_policies", "line_id", "model_lines"),
                     sa.UniqueConstraint("line_id", "version",
                                         name=op.f("uq_gate_policies_line_id_version"))],
    )
    record_table(
        "webhook_secrets",
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=False),
        sa.Column("rotated_at", TIMESTAMP, nullable=True),
        constraints=[foreign_key("webhook_secrets", "line_id", "model_lines"),
                     sa.UniqueConstraint("line_id", name=op.f("uq_webhook_secrets_line_id"))],
    )
    create_decisions()
    create_callbacks_and_promotions()


def create_decisions() -> None:
    """The decisions and the jobs that pending ones wait for."""
    record_table(
        "gate_decisions",
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("baseline_id", sa.Integer(), nullable=True),
        sa.Column("verdict", string_enum("verdict", "approve", "block", "pending"),
                  nullable=False),
        *(sa.Column(name, JSON, nullable=False)
          for name in ["reasons", "metrics", "evalsets"]),
        sa.Column("policy_version", sa.Integer(), nullable=True),
        sa.Column("policy", JSON, nullable=False),
        sa.Column("requested_by", NAME, nullable=False),
        sa.Column("ci", JSON, nullable=True),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("delivery_id", sa.String(length=200), nullable=True),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("base_url", sa.Text(), nullable=False),
        sa.Column("repair_of_id", sa.Integer(), nullable=True),
        sa.Column("decided_at", TIMESTAMP, nullable=True),
        constraints=[
            foreign_key("gate_decisions", "baseline_id", "model_versions"),
            foreign_key("gate_decisions", "candidate_id", "model_versions"),
            foreign_key("gate_decisions", "line_id", "model_lines"),
            foreign_key("gate_decisions", "repair_of_id", "gate_decisions"),
            sa.UniqueConstraint("line_id", "delivery_id",
                                name=op.f("uq_gate_decisions_line_id_delivery_id")),
        ],
    )
    op.create_index(op.f("ix_gate_decisions_verdict"), "gate_decisions", ["verdict"])
    op.create_table(
        "gate_decision_jobs",
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        foreign_key("gate_decision_jobs", "decision_id", "gate_decisions"),
        foreign_key("gate_decision_jobs", "job_id", "jobs"),
        sa.PrimaryKeyConstraint("decision_id", "job_id", name=op.f("pk_gate_decision_jobs")),
    )
    op.create_index(op.f("ix_gate_decision_jobs_job_id"), "gate_decision_jobs", ["job_id"])


def create_callbacks_and_promotions() -> None:
    record_table(
        "gate_callbacks",
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.Column("state", string_enum("callback_state", "queued", "delivered", "failed"),
                  nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", TIMESTAMP, nullable=True),
        constraints=[foreign_key("gate_callbacks", "decision_id", "gate_decisions"),
                     sa.UniqueConstraint("decision_id",
                                         name=op.f("uq_gate_callbacks_decision_id"))],
    )
    record_table(
        "promotions",
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("from_version_id", sa.Integer(), nullable=True),
        sa.Column("to_version_id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("requested_by", NAME, nullable=False),
        constraints=[foreign_key("promotions", "decision_id", "gate_decisions"),
                     foreign_key("promotions", "from_version_id", "model_versions"),
                     foreign_key("promotions", "line_id", "model_lines"),
                     foreign_key("promotions", "to_version_id", "model_versions")],
    )
    op.create_index(op.f("ix_promotions_line_id"), "promotions", ["line_id"])


def downgrade() -> None:
    for table in ["promotions", "gate_callbacks", "gate_decision_jobs", "gate_decisions",
                  "webhook_secrets", "gate_policies"]:
        op.drop_table(table)
    with op.batch_alter_table("model_lines") as batch:
        batch.drop_constraint(op.f("fk_model_lines_training_dataset_id_datasets"),
                              type_="foreignkey")
        batch.drop_column("training_dataset_id")
