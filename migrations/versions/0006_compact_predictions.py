"""Scale: each prediction's predicted classes in the smallest integer dtype, and each pair's
HTML report, kept as artifacts. Rows stored before get their classes from the next metrics
job that reads them; pairs measured before have no stored HTML page (GET answers 404
`report_html_not_stored`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("predictions") as batch:
        batch.add_column(sa.Column("classes_sha256", sa.String(length=64), nullable=True))
    with op.batch_alter_table("pair_metrics") as batch:
        batch.add_column(sa.Column("html_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_metrics") as batch:
        batch.drop_column("html_sha256")
    with op.batch_alter_table("predictions") as batch:
        batch.drop_column("classes_sha256")
