"""What every reader of a user's file shares: the file must exist, a refusal quotes the
first line of what went wrong, and a file is known by the sha256 of its bytes."""

import hashlib
from pathlib import Path

from flipgate.errors import InputError


def existing_file(path: str | Path, what: str, source: str | None = None) -> Path:
    """The file at `path`; none there is refused (`file_not_found`, naming it `source`)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("file_not_found", f"{source or path}: no such {what} file")
    return path


def first_line(error: Exception) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in chunks: how flipgate names a stored file (the
    server's store addresses artifacts by it, a traffic set's export order is seeded by it)."""
    with Path(path).open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
