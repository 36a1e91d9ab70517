"""Alembic migrations of the server's database (a package only so that wheels ship it)."""
