"""Multi-label lines and eval sets (issue 45): whether a line's versions score labels
(a 0/1 matrix (N, L) per eval set) instead of one class, whether an eval set's `y` is such a
matrix (and the names of its labels), and each multi-label version's decision threshold per
label.

The downgrade refuses, before changing anything, while a multi-label line or data set is
stored: below this revision its label matrices would be read as classes and its versions'
thresholds lost.

Revision ID: 0020_multilabel
Revises: 0019_version_project
Create Date: 2026-11-28 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import JSON
from service.migrate import MigrationRefused

revision: str = "0020_multilabel"
down_revision: str | Sequence[str] | None = "0019_version_project"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KIND_TABLES = ("model_lines", "datasets")
NAMES_SHOWN = 10  # multi-label lines or data sets a refusal names, per table


def upgrade() -> None:
    for table in KIND_TABLES:
        op.add_column(table, sa.Column("multilabel", sa.Boolean(), nullable=False,
                                       server_default=sa.false()))
    op.add_column("datasets", sa.Column("label_names", JSON, nullable=True))
    op.add_column("model_versions", sa.Column("thresholds", JSON, nullable=True))


def downgrade() -> None:
    """Drop the columns; refused while a multi-label line or data set is stored."""
    _refuse_multilabel_rows()
    op.drop_column("model_versions", "thresholds")
    op.drop_column("datasets", "label_names")
    for table in KIND_TABLES:
        op.drop_column(table, "multilabel")


def _refuse_multilabel_rows() -> None:
    """Raise while a line or data set is multi-label (a multi-label traffic set's label
    revisions belong to its data set): the revisions below would take each for single-label
    and drop the thresholds its versions decide at."""
    stored = {table: _multilabel_names(table) for table in KIND_TABLES}
    if any(stored.values()):
        held = "; ".join(f"{table}: {', '.join(names)}" for table, names in stored.items()
                         if names)
        raise MigrationRefused("multilabel_data_stored", (
            f"cannot downgrade below {revision}: multi-label lines and data sets are stored, "
            "which the revisions before it would read as single-label (label matrices taken "
            "for classes, each version's thresholds dropped); stay at this revision or later, or "
            "first remove them (and what refers to them) from the database. Stored "
            f"(project/name): {held}"))


def _multilabel_names(table: str) -> list[str]:
    """'project/name' of the multi-label rows of `table`, the first NAMES_SHOWN and a count
    of the others."""
    names = op.get_bind().execute(sa.text(
        f"SELECT projects.name || '/' || {table}.name FROM {table} JOIN projects "
        f"ON projects.id = {table}.project_id WHERE {table}.multilabel "
        "ORDER BY 1")).scalars().all()
    more = len(names) - NAMES_SHOWN
    return [repr(name) for name in names[:NAMES_SHOWN]] + ([f"{more} more"] if more > 0 else [])
