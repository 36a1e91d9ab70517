"""Hostile clients (issue 20). A signed gate request is accepted once: signature_digest keeps
the HMAC that authenticated a webhook (it covers the body and the signing time), unique in
its line, so the same signed request sent again under a new delivery id is refused; and
callback URLs are shown without their credentials: gate_decisions.callback_url_sealed keeps
a URL that carries a password or a query encrypted with the server's key (the plain column
its redacted form). URLs stored before stay as they were. ended_sessions keeps the dashboard
sessions that were signed out, until their cookies expire.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 00:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import TIMESTAMP

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNIQUE = "uq_gate_decisions_line_id_signature_digest"


def upgrade() -> None:
    op.create_table("ended_sessions",
                    sa.Column("session_id", sa.String(32), nullable=False),
                    sa.Column("expires_at", TIMESTAMP, nullable=False),
                    sa.PrimaryKeyConstraint("session_id", name=op.f("pk_ended_sessions")))
    with op.batch_alter_table("gate_decisions") as batch:
        batch.add_column(sa.Column("signature_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("callback_url_sealed", sa.Text(), nullable=True))
        batch.create_unique_constraint(op.f(UNIQUE), ["line_id", "signature_digest"])


def downgrade() -> None:
    op.drop_table("ended_sessions")
    with op.batch_alter_table("gate_decisions") as batch:
        batch.drop_constraint(op.f(UNIQUE), type_="unique")
        batch.drop_column("callback_url_sealed")
        batch.drop_column("signature_digest")
