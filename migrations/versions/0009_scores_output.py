"""Any ONNX classifier: which output of a version holds its scores and what they are
(logits or probabilities), chosen and detected at registration or given by the `output` and
`scores` form fields. Versions registered before keep NULL: their one output holds logits.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions") as table:
        table.add_column(sa.Column("scores_output", sa.String(256), nullable=True))
        table.add_column(sa.Column("scores_kind", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_versions") as table:
        table.drop_column("scores_kind")
        table.drop_column("scores_output")
