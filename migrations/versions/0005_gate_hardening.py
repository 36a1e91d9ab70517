"""Gate hardening: webhook secrets encrypted with the server key, and the previous secret of
a rotation kept for its grace period.

Revision ID: 0005
Revises: 0002
Create Date: 2026-11-23 05:40:00
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op
from cryptography.fernet import Fernet

from migrations.helpers import TIMESTAMP
from service.config import Settings, get_settings
from service.sealing import cipher

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SECRETS = sa.table("webhook_secrets", sa.column("id", sa.Integer()),
                   sa.column("secret", sa.Text()))


def upgrade() -> None:
    with op.batch_alter_table("webhook_secrets") as batch:
        batch.alter_column("secret", type_=sa.Text(), existing_type=sa.String(length=64),
                           existing_nullable=False)
        batch.add_column(sa.Column("previous_secret", sa.Text(), nullable=True))
        batch.add_column(sa.Column("previous_until", TIMESTAMP, nullable=True))
    reseal(lambda box, secret: box.encrypt(secret.encode()).decode())


def downgrade() -> None:
    reseal(lambda box, secret: box.decrypt(secret.encode()).decode())
    with op.batch_alter_table("webhook_secrets") as batch:
        batch.drop_column("previous_until")
        batch.drop_column("previous_secret")
        batch.alter_column("secret", type_=sa.String(length=64), existing_type=sa.Text(),
                           existing_nullable=False)


def reseal(change: Callable[[Fernet, str], str]) -> None:
    """Rewrite every stored secret with `change(cipher, secret)`; the key is read only when
    there is a secret to change."""
    connection = op.get_bind()
    rows = connection.execute(sa.select(SECRETS.c.id, SECRETS.c.secret)).all()
    if not rows:
        return
    box = cipher(migration_settings())
    for row in rows:
        connection.execute(SECRETS.update().where(SECRETS.c.id == row.id)
                           .values(secret=change(box, row.secret)))


def migration_settings() -> Settings:
    """The settings `flipgate migrate` runs with (service.migrate hands them over)."""
    return op.get_context().config.attributes.get("settings") or get_settings()
