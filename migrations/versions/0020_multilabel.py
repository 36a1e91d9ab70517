"""Multi-label lines and eval sets (issue 45): whether a line's versions score labels
(a 0/1 matrix (N, L) per eval set) instead of one class, whether an eval set's `y` is such a
matrix (and the names of its labels), and each multi-label version's decision threshold per
label.

Revision ID: 0020_multilabel
Revises: 0019_version_project
Create Date: 2026-11-28 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON

revision: str = "0020_multilabel"
down_revision: str | Sequence[str] | None = "0019_version_project"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KIND_TABLES = ("model_lines", "datasets")


def upgrade() -> None:
    for table in KIND_TABLES:
        op.add_column(table, sa.Column("multilabel", sa.Boolean(), nullable=False,
                                       server_default=sa.false()))
    op.add_column("datasets", sa.Column("label_names", JSON, nullable=True))
    op.add_column("model_versions", sa.Column("thresholds", JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("model_versions", "thresholds")
    op.drop_column("datasets", "label_names")
    for table in KIND_TABLES:
        op.drop_column(table, "multilabel")
