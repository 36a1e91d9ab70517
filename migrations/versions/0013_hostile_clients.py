"""A signed gate request is accepted once (issue 20): gate_decisions.signature_digest keeps
the HMAC that authenticated a webhook (it covers the body and the signing time), unique in
its line, so the same signed request sent again under a new delivery id is refused.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 00:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNIQUE = "uq_gate_decisions_line_id_signature_digest"


def upgrade() -> None:
    with op.batch_alter_table("gate_decisions") as batch:
        batch.add_column(sa.Column("signature_digest", sa.String(64), nullable=True))
        batch.create_unique_constraint(op.f(UNIQUE), ["line_id", "signature_digest"])


def downgrade() -> None:
    with op.batch_alter_table("gate_decisions") as batch:
        batch.drop_constraint(op.f(UNIQUE), type_="unique")
        batch.drop_column("signature_digest")
