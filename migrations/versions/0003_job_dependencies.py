"""Job dependencies as rows: a job waits for others in job_dependencies, no longer in the
"after" list of its JSON params (existing lists are moved into the table).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON, foreign_key

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOBS = sa.table("jobs", sa.column("id", sa.Integer()), sa.column("params", JSON))
DEPENDENCIES = sa.table("job_dependencies", sa.column("job_id", sa.Integer()),
                        sa.column("waits_for_id", sa.Integer()))


def upgrade() -> None:
    op.create_table(
        "job_dependencies",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("waits_for_id", sa.Integer(), nullable=False),
        foreign_key("job_dependencies", "job_id", "jobs"),
        foreign_key("job_dependencies", "waits_for_id", "jobs"),
        sa.PrimaryKeyConstraint("job_id", "waits_for_id", name=op.f("pk_job_dependencies")),
    )
    op.create_index(op.f("ix_job_dependencies_waits_for_id"), "job_dependencies",
                    ["waits_for_id"])
    connection = op.get_bind()
    for job_id, params in connection.execute(sa.select(JOBS.c.id, JOBS.c.params)).all():
        after = (params or {}).get("after")
        if after is None:
            continue
        if after:
            connection.execute(DEPENDENCIES.insert(), [
                {"job_id": job_id, "waits_for_id": other} for other in dict.fromkeys(after)])
        _set_params(connection, job_id, {k: v for k, v in params.items() if k != "after"})


def downgrade() -> None:
    connection = op.get_bind()
    waits: dict[int, list[int]] = {}
    for job_id, other in connection.execute(sa.select(
            DEPENDENCIES.c.job_id, DEPENDENCIES.c.waits_for_id).order_by(
            DEPENDENCIES.c.job_id, DEPENDENCIES.c.waits_for_id)).all():
        waits.setdefault(job_id, []).append(other)
    for job_id, after in waits.items():
        params = connection.execute(sa.select(JOBS.c.params).where(JOBS.c.id == job_id)).scalar()
        _set_params(connection, job_id, {**(params or {}), "after": after})
    op.drop_table("job_dependencies")


def _set_params(connection: sa.Connection, job_id: int, params: dict) -> None:
    connection.execute(JOBS.update().where(JOBS.c.id == job_id).values(params=params))
