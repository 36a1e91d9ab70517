"""A line's matrix from compact counts: one pair_counts row per unordered pair of versions on
a data set, stored by the new `matrix` job kind from the versions' predicted classes. Nothing
is filled in: the next POST /models/{name}/matrix, or the next logits stored for one of a
line's versions, queues the job that stores a line's counts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import foreign_key, job_kinds, record_table

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_KINDS = ("inference", "metrics", "train")
COUNTS = ("n", "only_first_right", "only_second_right", "differ")


def upgrade() -> None:
    record_table(
        "pair_counts",
        *(sa.Column(name, sa.Integer(), nullable=False)
          for name in ("first_version_id", "second_version_id", "dataset_id")),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in COUNTS),
        constraints=[
            sa.CheckConstraint("first_version_id < second_version_id",
                               name=op.f("ck_pair_counts_ordered")),
            foreign_key("pair_counts", "dataset_id", "datasets"),
            foreign_key("pair_counts", "first_version_id", "model_versions"),
            foreign_key("pair_counts", "second_version_id", "model_versions"),
            sa.UniqueConstraint(
                "first_version_id", "second_version_id", "dataset_id",
                name=op.f("uq_pair_counts_first_version_id_second_version_id_dataset_id")),
        ],
    )
    op.create_index(op.f("ix_pair_counts_dataset_id"), "pair_counts", ["dataset_id"])
    job_kinds(JOB_KINDS, (*JOB_KINDS, "matrix"))


def downgrade() -> None:
    op.execute("DELETE FROM job_dependencies WHERE job_id IN "
               "(SELECT id FROM jobs WHERE kind = 'matrix') OR waits_for_id IN "
               "(SELECT id FROM jobs WHERE kind = 'matrix')")
    op.execute("DELETE FROM jobs WHERE kind = 'matrix'")
    job_kinds((*JOB_KINDS, "matrix"), JOB_KINDS)
    op.drop_index(op.f("ix_pair_counts_dataset_id"), table_name="pair_counts")
    op.drop_table("pair_counts")
