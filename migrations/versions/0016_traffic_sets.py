"""Traffic sets (issue 36): an eval set without labels (`datasets.labeled` false, its class
count unknown until the models name one), its labels added later as revisions
(`dataset_labels`: the cumulative labels of each import, append-only), and pair reports
that need no labels (`pair_metrics`' label columns nullable) measured again for each label
revision (`pair_metrics.label_revision`, 0 on a labeled set), with the disagreements' export
the metrics job stored (`pair_metrics.export_sha256`).

Revision ID: 0016_traffic_sets
Revises: 0015_request_ids
Create Date: 2026-11-27 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import SHA256, foreign_key, record_table

revision: str = "0016_traffic_sets"
down_revision: str | Sequence[str] | None = "0015_request_ids"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_UNIQUE = "uq_pair_metrics_old_version_id_new_version_id_dataset_id"
NEW_UNIQUE = "uq_pair_metrics_old_version_id_new_version_id_dataset_id_label_revision"
LABEL_COLUMNS = {"er_old": sa.Double(), "er_new": sa.Double(), "nfr": sa.Double(),
                 "pfr": sa.Double(), "negative_flips": sa.Integer(),
                 "positive_flips": sa.Integer(), "both_wrong": sa.Integer(),
                 "nfr_ci_low": sa.Double(), "nfr_ci_high": sa.Double(),
                 "mcnemar_p": sa.Double()}


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("labeled", sa.Boolean(), nullable=False,
                                   server_default=sa.true()))
        batch.alter_column("num_classes", existing_type=sa.Integer(), nullable=True)
    with op.batch_alter_table("pair_metrics") as batch:
        batch.add_column(sa.Column("label_revision", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("export_sha256", SHA256, nullable=True))
        for name, column_type in LABEL_COLUMNS.items():
            batch.alter_column(name, existing_type=column_type, nullable=True)
        batch.drop_constraint(op.f(OLD_UNIQUE), type_="unique")
        batch.create_unique_constraint(op.f(NEW_UNIQUE), ["old_version_id", "new_version_id",
                                                          "dataset_id", "label_revision"])
    record_table(
        "dataset_labels",
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("sha256", SHA256, nullable=False),
        sa.Column("added", sa.Integer(), nullable=False),
        sa.Column("labelled", sa.Integer(), nullable=False),
        constraints=[foreign_key("dataset_labels", "dataset_id", "datasets"),
                     sa.UniqueConstraint("dataset_id", "revision",
                                         name=op.f("uq_dataset_labels_dataset_id_revision"))])


def downgrade() -> None:
    op.drop_table("dataset_labels")
    op.execute("DELETE FROM pair_metrics WHERE label_revision > 0 OR nfr IS NULL")
    with op.batch_alter_table("pair_metrics") as batch:
        batch.drop_constraint(op.f(NEW_UNIQUE), type_="unique")
        batch.create_unique_constraint(op.f(OLD_UNIQUE), ["old_version_id", "new_version_id",
                                                          "dataset_id"])
        for name, column_type in LABEL_COLUMNS.items():
            batch.alter_column(name, existing_type=column_type, nullable=False)
        batch.drop_column("export_sha256")
        batch.drop_column("label_revision")
    with op.batch_alter_table("datasets") as batch:
        batch.alter_column("num_classes", existing_type=sa.Integer(), nullable=False)
        batch.drop_column("labeled")
