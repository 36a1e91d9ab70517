"""A personal token holds its owner (issue 46): `api_tokens.owner`, the OpenID subject of
the person who minted it on the dashboard (NULL for a token minted by `flipgate token
create` or the API), and `owner_groups`, the groups they had then, so that the tokens page
lists a person's tokens through an index and a grant removed or lowered revokes the tokens
it no longer covers (service.auth.personal).

Upgrading fills both in for the personal tokens minted before: the owner is the person
whose `ok` audit event `mint_personal_token` (auth `oidc`) names the token (its project and
name), as the tokens page read it until now; their groups are those of their last sign-in
(`people.groups`), the only ones stored.

Revision ID: 0021_token_owner
Revises: 0020_multilabel
Create Date: 2026-11-28 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON

revision: str = "0021_token_owner"
down_revision: str | Sequence[str] | None = "0020_multilabel"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRINCIPAL = sa.String(length=255)
TOKENS = sa.table("api_tokens", sa.column("project_id", sa.Integer()),
                  sa.column("name", sa.String()), sa.column("owner", PRINCIPAL),
                  sa.column("owner_groups", JSON))
EVENTS = sa.table("audit_events", sa.column("actor", PRINCIPAL), sa.column("auth"),
                  sa.column("project_id", sa.Integer()), sa.column("action"),
                  sa.column("outcome"), sa.column("details", JSON))
PEOPLE = sa.table("people", sa.column("subject", PRINCIPAL), sa.column("groups", JSON))


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("owner", PRINCIPAL, nullable=True))
        batch.add_column(sa.Column("owner_groups", JSON, nullable=True))
        batch.create_index(op.f("ix_api_tokens_owner"), ["owner"])
    _backfill_owners()


def _backfill_owners() -> None:
    """Each personal token's owner, from the audit event of its minting, and their groups."""
    bind = op.get_bind()
    minted = bind.execute(sa.select(EVENTS.c.actor, EVENTS.c.project_id, EVENTS.c.details,
                                    PEOPLE.c.groups)
                          .join(PEOPLE, PEOPLE.c.subject == EVENTS.c.actor, isouter=True)
                          .where(EVENTS.c.auth == "oidc",
                                 EVENTS.c.action == "mint_personal_token",
                                 EVENTS.c.outcome == "ok"))
    for actor, project_id, details, groups in minted:
        bind.execute(TOKENS.update().where(TOKENS.c.project_id == project_id,
                                           TOKENS.c.name == (details or {}).get("name"))
                     .values(owner=actor, owner_groups=groups or []))


def downgrade() -> None:
    """The tokens lose their owners (the audit trail still names them)."""
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_index(op.f("ix_api_tokens_owner"))
        batch.drop_column("owner_groups")
        batch.drop_column("owner")
