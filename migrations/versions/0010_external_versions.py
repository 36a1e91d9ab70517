"""External versions (issue 19): a version registered without a model file has no artifact
and no input signature, its predictions may be labels only (no logits artifact), and a
pair report over labels has no SChurn.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION_COLUMNS = (("artifact_sha256", sa.String(64)), ("input_name", sa.String(256)),
                   ("input_shape", JSON))


def upgrade() -> None:
    _set_nullable(True)


def downgrade() -> None:
    """Refused while external versions or labels-only predictions exist (they would break
    the NOT NULL columns); remove them first."""
    _set_nullable(False)


def _set_nullable(nullable: bool) -> None:
    with op.batch_alter_table("model_versions") as batch:
        for name, type_ in VERSION_COLUMNS:
            batch.alter_column(name, existing_type=type_, nullable=nullable)
    with op.batch_alter_table("predictions") as batch:
        batch.alter_column("logits_sha256", existing_type=sa.String(64), nullable=nullable)
    with op.batch_alter_table("pair_metrics") as batch:
        batch.alter_column("schurn", existing_type=sa.Double(), nullable=nullable)
