"""Initial schema: model lines, versions, aliases, data sets, predictions, pair metrics,
jobs and API tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 00:10:22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON, NAME, SHA256, TIMESTAMP, foreign_key, record_table, string_enum

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

def upgrade() -> None:
    record_table(
        "api_tokens",
        sa.Column("name", NAME, nullable=False),
        sa.Column("token_hash", SHA256, nullable=False),
        sa.Column("scopes", JSON, nullable=False),
        sa.Column("revoked_at", TIMESTAMP, nullable=True),
        constraints=[sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
                     sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash"))],
    )
    record_table(
        "datasets",
        sa.Column("name", NAME, nullable=False),
        sa.Column("role", string_enum("dataset_role", "eval", "train"), nullable=False),
        sa.Column("sha256", SHA256, nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("num_classes", sa.Integer(), nullable=False),
        sa.Column("sample_shape", JSON, nullable=False),
        constraints=[sa.CheckConstraint("n >= 1", name=op.f("ck_datasets_n")),
                     sa.CheckConstraint("num_classes >= 1", name=op.f("ck_datasets_num_classes")),
                     sa.UniqueConstraint("name", name=op.f("uq_datasets_name"))],
    )
    record_table(
        "jobs",
        sa.Column("kind", string_enum("job_kind", "inference", "metrics", "train"),
                  nullable=False),
        sa.Column("state", string_enum("job_state", "queued", "running", "succeeded", "failed",
                                       "cancelled"), nullable=False),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("result", JSON, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        constraints=[sa.CheckConstraint("progress >= 0 AND progress <= 1",
                                        name=op.f("ck_jobs_progress")),
                     foreign_key("jobs", "parent_id", "jobs")],
    )
    op.create_index(op.f("ix_jobs_parent_id"), "jobs", ["parent_id"])
    record_table(
        "model_lines",
        sa.Column("name", NAME, nullable=False),
        sa.Column("num_classes", sa.Integer(), nullable=False),
        sa.Column("class_names", JSON, nullable=True),
        constraints=[sa.CheckConstraint("num_classes >= 2",
                                        name=op.f("ck_model_lines_num_classes")),
                     sa.UniqueConstraint("name", name=op.f("uq_model_lines_name"))],
    )
    record_table(
        "model_versions",
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("version", NAME, nullable=False),
        sa.Column("artifact_sha256", SHA256, nullable=False),
        sa.Column("input_name", sa.String(length=256), nullable=False),
        sa.Column("input_shape", JSON, nullable=False),
        sa.Column("num_classes", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("produced_by", JSON, nullable=True),
        sa.Column("metadata", JSON, nullable=False),
        constraints=[sa.CheckConstraint("num_classes >= 2",
                                        name=op.f("ck_model_versions_num_classes")),
                     foreign_key("model_versions", "line_id", "model_lines"),
                     foreign_key("model_versions", "parent_id", "model_versions"),
                     sa.UniqueConstraint("line_id", "version",
                                         name=op.f("uq_model_versions_line_id_version"))],
    )
    record_table(
        "model_aliases",
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        constraints=[foreign_key("model_aliases", "line_id", "model_lines"),
                     foreign_key("model_aliases", "version_id", "model_versions"),
                     sa.UniqueConstraint("line_id", "name",
                                         name=op.f("uq_model_aliases_line_id_name"))],
    )
    create_pair_metrics()
    record_table(
        "predictions",
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("logits_sha256", SHA256, nullable=False),
        sa.Column("source", string_enum("prediction_source", "computed", "uploaded"),
                  nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=True),
        constraints=[foreign_key("predictions", "dataset_id", "datasets"),
                     foreign_key("predictions", "version_id", "model_versions"),
                     sa.UniqueConstraint("version_id", "dataset_id",
                                         name=op.f("uq_predictions_version_id_dataset_id"))],
    )
    op.create_index(op.f("ix_predictions_dataset_id"), "predictions", ["dataset_id"])


def create_pair_metrics() -> None:
    """Every scalar of the compare report as a column, and the report as JSON."""
    rates = ["er_old", "er_new", "nfr", "pfr"]
    optional_rates = ["rel_nfr", "nfi", "btc", "bec"]
    record_table(
        "pair_metrics",
        *(sa.Column(name, sa.Integer(), nullable=False)
          for name in ["old_version_id", "new_version_id", "dataset_id", "n"]),
        *(sa.Column(name, sa.Double(), nullable=False) for name in rates),
        *(sa.Column(name, sa.Double(), nullable=True) for name in optional_rates),
        sa.Column("churn", sa.Double(), nullable=False),
        sa.Column("churn_old_correct", sa.Double(), nullable=True),
        sa.Column("churn_old_incorrect", sa.Double(), nullable=True),
        sa.Column("schurn", sa.Double(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False)
          for name in ["negative_flips", "positive_flips", "both_wrong"]),
        *(sa.Column(name, sa.Double(), nullable=False)
          for name in ["nfr_ci_low", "nfr_ci_high", "mcnemar_p"]),
        sa.Column("report", JSON, nullable=False),
        constraints=[
            sa.CheckConstraint("old_version_id <> new_version_id",
                               name=op.f("ck_pair_metrics_distinct")),
            foreign_key("pair_metrics", "dataset_id", "datasets"),
            foreign_key("pair_metrics", "new_version_id", "model_versions"),
            foreign_key("pair_metrics", "old_version_id", "model_versions"),
            sa.UniqueConstraint(
                "old_version_id", "new_version_id", "dataset_id",
                name=op.f("uq_pair_metrics_old_version_id_new_version_id_dataset_id")),
        ],
    )
    op.create_index(op.f("ix_pair_metrics_dataset_id"), "pair_metrics", ["dataset_id"])


def downgrade() -> None:
    for table in ["predictions", "pair_metrics", "model_aliases", "model_versions",
                  "model_lines", "jobs", "datasets", "api_tokens"]:
        op.drop_table(table)
