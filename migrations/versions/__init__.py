"""Alembic revisions, applied in order by `flipgate migrate`."""
