"""Each version holds its line's project (issue 47): `model_versions.project_id`, filled in
from the version's line, so that a session bound to a project filters versions by their own
column (service.projects.scoping) and a version loaded by a raw id is filtered too. The
foreign key (line_id, project_id) -> model_lines (id, project_id) replaces the one on
line_id alone: a version cannot hold a project other than its line's.

Revision ID: 0019_version_project
Revises: 0018_ended_at_indexes
Create Date: 2026-11-28 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_version_project"
down_revision: str | Sequence[str] | None = "0018_ended_at_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LINE_KEY = ("id", "project_id")  # of model_lines: what a version's key points at
VERSION_KEY = ("line_id", "project_id")


def upgrade() -> None:
    with op.batch_alter_table("model_lines") as batch:
        batch.create_unique_constraint(op.f("uq_model_lines_id_project_id"), list(LINE_KEY))
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
    op.execute("UPDATE model_versions SET project_id = (SELECT model_lines.project_id "
               "FROM model_lines WHERE model_lines.id = model_versions.line_id)")
    with op.batch_alter_table("model_versions") as batch:
        batch.alter_column("project_id", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(op.f("fk_model_versions_project_id_projects"), "projects",
                                 ["project_id"], ["id"])
        batch.create_index(op.f("ix_model_versions_project_id"), ["project_id"])
        batch.drop_constraint(op.f("fk_model_versions_line_id_model_lines"),
                              type_="foreignkey")
        batch.create_foreign_key(op.f("fk_model_versions_line_id_project_id_model_lines"),
                                 "model_lines", list(VERSION_KEY), list(LINE_KEY))


def downgrade() -> None:
    """The versions lose their column (their lines keep the project); the foreign key on
    line_id alone comes back."""
    with op.batch_alter_table("model_versions") as batch:
        batch.drop_constraint(op.f("fk_model_versions_line_id_project_id_model_lines"),
                              type_="foreignkey")
        batch.create_foreign_key(op.f("fk_model_versions_line_id_model_lines"), "model_lines",
                                 ["line_id"], ["id"])
        batch.drop_index(op.f("ix_model_versions_project_id"))
        batch.drop_constraint(op.f("fk_model_versions_project_id_projects"), type_="foreignkey")
        batch.drop_column("project_id")
    with op.batch_alter_table("model_lines") as batch:
        batch.drop_constraint(op.f("uq_model_lines_id_project_id"), type_="unique")
